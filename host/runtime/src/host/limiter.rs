//! The memory limiter: one limit over every linear memory and table of an instance's store.

/// Most core instances, linear memories and tables one instance's store may create. The
/// components the SDKs build stay well below (a Python component has about a dozen core
/// instances and two memories); the counts bound what a crafted component can make the host
/// allocate besides the bytes [`MemoryLimiter`] counts.
pub(super) const MAX_CORE_INSTANCES: usize = 64;
pub(super) const MAX_MEMORIES: usize = 8;
pub(super) const MAX_TABLES: usize = 64;
/// What a table element costs the host, for the memory limit (a function reference).
const TABLE_ELEMENT_BYTES: usize = 8;

/// Denies growth of linear memories and tables past the instance's limit, which covers all
/// of them together, and remembers that it did, so the trap that usually follows (an
/// allocation failure) can be explained.
pub(crate) struct MemoryLimiter {
    max: usize,
    hit: bool,
    /// Bytes of every linear memory and table of the store.
    total: usize,
    /// The largest `total` reached, in bytes (the instance's high-water mark).
    pub(crate) peak: usize,
}

impl MemoryLimiter {
    pub(super) fn new(max: usize) -> MemoryLimiter {
        MemoryLimiter {
            max,
            hit: false,
            total: 0,
            peak: 0,
        }
    }

    pub(super) fn max(&self) -> usize {
        self.max
    }

    /// Whether growth was ever denied.
    pub(super) fn hit(&self) -> bool {
        self.hit
    }

    /// Grows the total from `current` to `desired` bytes of one memory or table, if the
    /// limit allows.
    fn grow(&mut self, current: usize, desired: usize) -> bool {
        let total = (self.total - current.min(self.total)).saturating_add(desired);
        if total > self.max {
            self.hit = true;
            return false;
        }
        self.total = total;
        self.peak = self.peak.max(total);
        true
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(current, desired))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(
            current.saturating_mul(TABLE_ELEMENT_BYTES),
            desired.saturating_mul(TABLE_ELEMENT_BYTES),
        ))
    }

    fn instances(&self) -> usize {
        MAX_CORE_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A core module with `count` linear memories of `pages` 64 KiB pages each, written out
    /// by hand (magic, version, one memory section).
    fn module_with_memories(count: u8, pages: u8) -> Vec<u8> {
        let mut section = vec![count];
        for _ in 0..count {
            section.extend([0x00, pages]);
        }
        let mut wasm = b"\0asm\x01\0\0\0".to_vec();
        wasm.push(5);
        wasm.push(section.len() as u8);
        wasm.extend(section);
        wasm
    }

    fn instantiate(wasm: &[u8], limit: usize) -> wasmtime::Result<usize> {
        let engine = wasmtime::Engine::default();
        let module = wasmtime::Module::new(&engine, wasm)?;
        let mut store = wasmtime::Store::new(&engine, MemoryLimiter::new(limit));
        store.limiter(|l| l);
        wasmtime::Instance::new(&mut store, &module, &[])?;
        Ok(store.data().peak)
    }

    #[test]
    fn the_memory_limit_covers_all_memories_together() {
        const PAGE: usize = 64 << 10;
        // Two memories of two pages: four pages in all, the high-water mark.
        assert_eq!(
            instantiate(&module_with_memories(2, 2), 4 * PAGE).unwrap(),
            4 * PAGE
        );
        // Each would fit alone; together they do not.
        let err = instantiate(&module_with_memories(2, 2), 3 * PAGE).unwrap_err();
        assert!(format!("{err:#}").contains("memory"), "{err:#}");
    }

    #[test]
    fn an_instance_may_have_only_so_many_memories() {
        assert!(instantiate(&module_with_memories(MAX_MEMORIES as u8, 0), 1 << 20).is_ok());
        let err =
            instantiate(&module_with_memories(MAX_MEMORIES as u8 + 24, 0), 1 << 20).unwrap_err();
        assert!(format!("{err:#}").contains("memor"), "{err:#}");
    }
}
