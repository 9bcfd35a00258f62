//! The [`Runtime`]: the wasmtime engine, the linker with the host imports, the tokio runtime
//! guest calls are driven on, and loading a component into a [`Processor`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use wasmtime::Engine;
use wasmtime::component::Linker;

use crate::error::{LoadError, RuntimeError};
use crate::host::{self, HostState};
use crate::load::{self, ExportsPre, Processor};
use crate::sandbox::{self, Limits};
use crate::{WORLD, cache};

/// Settings of a [`Runtime`].
#[derive(Clone, Debug, Default)]
pub struct RuntimeConfig {
    /// Where compiled components are cached by content hash; `None` disables the disk cache.
    pub cache_dir: Option<PathBuf>,
    /// How many bytes of compiled components the cache keeps: past it, writing one removes
    /// the least recently used ([`cache::trim`]). `None`: never trimmed here, for a cache
    /// something else manages (the server's own, reclaimed as processors are deleted).
    pub cache_max_bytes: Option<u64>,
    /// Sandbox limits applied to every call.
    pub limits: Limits,
    /// Call processors key by key even when they export `batch-processor` (for comparing
    /// the two; batched calls are faster).
    pub per_key_calls: bool,
}

/// The wasmtime engine, the linker with the host imports, and the compiled-component cache.
pub struct Runtime {
    engine: Engine,
    linker: Linker<HostState>,
    config: RuntimeConfig,
    tokio: Arc<TokioRuntime>,
    _ticker: sandbox::EpochTicker,
}

/// The tokio runtime guest calls are driven on: its timers bound guests blocked in host
/// calls, and its worker drives outbound HTTP connections. Shared by every processor and
/// instance of a [`Runtime`], and shut down without blocking when the last one goes (it may
/// be dropped inside another runtime, e.g. the server's).
pub(crate) struct TokioRuntime(Option<tokio::runtime::Runtime>);

impl TokioRuntime {
    pub(crate) fn handle(&self) -> tokio::runtime::Handle {
        self.0
            .as_ref()
            .expect("runtime present until drop")
            .handle()
            .clone()
    }
}

impl Drop for TokioRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl Runtime {
    /// Creates a runtime. Starts one background thread that advances the epoch used for
    /// CPU deadlines.
    pub fn new(config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        let engine = sandbox::engine().map_err(RuntimeError::Engine)?;
        let mut linker = Linker::new(&engine);
        host::add_to_linker(&mut linker).map_err(RuntimeError::Link)?;
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("statebox-io")
            .enable_all()
            .build()
            .map_err(RuntimeError::Io)?;
        let ticker = sandbox::EpochTicker::start(engine.clone());
        Ok(Runtime {
            engine,
            linker,
            config,
            tokio: Arc::new(TokioRuntime(Some(tokio))),
            _ticker: ticker,
        })
    }

    /// The limits every call runs under.
    pub fn limits(&self) -> &Limits {
        &self.config.limits
    }

    /// Loads a processor from a `.wasm` file.
    pub fn load_file(&self, path: &Path) -> Result<Processor, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        self.load(&bytes)
    }

    /// Compiles (or fetches from the cache), checks and describes a processor component.
    pub fn load(&self, bytes: &[u8]) -> Result<Processor, LoadError> {
        self.load_with_limits(bytes, self.config.limits.clone())
    }

    /// Like [`load`](Self::load), but every call of the processor runs under `limits`
    /// instead of the runtime's: how a multi-tenant host applies each tenant's limits while
    /// sharing one engine and its compiled-component cache.
    pub fn load_with_limits(&self, bytes: &[u8], limits: Limits) -> Result<Processor, LoadError> {
        sandbox::check_component_header(bytes).map_err(LoadError::Invalid)?;
        let hash = blake3::hash(bytes).to_hex().to_string();
        let component = cache::compile_cached(
            &self.engine,
            self.config.cache_dir.as_deref(),
            self.config.cache_max_bytes,
            bytes,
            &hash,
        )?;
        let instance_pre = self.linker.instantiate_pre(&component).map_err(|e| {
            LoadError::Invalid(format!(
                "it imports something the Statebox host does not provide \
                 (processors may import only world {WORLD} and WASI): {e:#}"
            ))
        })?;
        let mut pre = ExportsPre::new(instance_pre, self.tokio.clone())?;
        if self.config.per_key_calls {
            pre.batch = None;
        }
        let (info, positional) = load::describe(&pre, &limits)?;
        Ok(Processor::new(pre, hash, info, limits, positional))
    }
}
