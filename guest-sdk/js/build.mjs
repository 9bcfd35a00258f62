#!/usr/bin/env node
// Builds a Statebox processor written in JavaScript or TypeScript into a WebAssembly component.
//
//   node guest-sdk/js/build.mjs PROCESSOR [-o OUT.wasm] [--cache-dir DIR] [--disable FEATURES] [--quiet]
//
// PROCESSOR is a `.ts`/`.js`/`.mjs` file whose default export is the processor, or a plugin
// folder holding `processor.ts` or `processor.js` (or naming its file in package.json `main`).
//
// 1. esbuild bundles the processor with the SDK (transpiling TypeScript; types are not
//    checked). Syntax and resolution errors are reported as `file:line:column: error: ...`.
// 2. The bundle, the WIT and the options are hashed; with `--cache-dir`, a component built
//    before from the same hash is reused.
// 3. componentize-js splices the bundle into the StarlingMonkey engine and pre-initialises
//    it with wizer: the module's top-level code runs here, so errors in it fail the build.
//    The component targets the world `stateful-batch-processor`: it exports both the
//    single-key `processor` interface and `batch-processor` (many keys per call).
//
// With `-o` the component is written there; without it, its path (in the cache) is printed on
// standard output. A summary (size, build time) goes to standard error unless `--quiet`.

import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, realpathSync } from 'node:fs';
import { copyFile, mkdir, mkdtemp, readFile, rename, rm, rmdir, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, dirname, extname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const SDK_DIR = dirname(fileURLToPath(import.meta.url));
const WIT_DIR = resolve(SDK_DIR, '../../wit');
/**
 * The world components are built against: `stateful-processor` plus the batched handlers
 * (`batch-processor`, many keys per call) and the `keys` import that selects a call's key.
 */
const WORLD = 'stateful-batch-processor';
/** Bumped when the way a component is produced changes, so cached components are rebuilt. */
const BUILD_FORMAT = 2;
/**
 * WASI features the engine is built without by default. The host links no `wasi:http`, so
 * `http` and `fetch-event` must go; `stdio`, `random` and `clocks` stay: the host answers them
 * with its captured stderr and its virtual (replayable) clock and randomness, while without
 * them `Date.now()` or `Math.random()` trap. Size and start-up are the same either way (README).
 */
const DEFAULT_DISABLED = ['http', 'fetch-event'];
const KNOWN_FEATURES = ['stdio', 'random', 'clocks', 'http', 'fetch-event'];
const BUNDLE_NAME = 'processor.bundle.js';

export class BuildError extends Error {}

function usage() {
  return (
    'usage: build.mjs PROCESSOR(.ts|.js|folder) [-o OUT.wasm] [--cache-dir DIR] ' +
    '[--disable FEATURES|none] [--no-typecheck] [--quiet]'
  );
}

function parseArgs(argv) {
  const opts = {
    input: undefined,
    out: undefined,
    cacheDir: undefined,
    disable: DEFAULT_DISABLED,
    quiet: false,
    typecheck: true,
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new BuildError(`${arg} needs a value\n${usage()}`);
      return argv[++i];
    };
    if (arg === '-o' || arg === '--out') opts.out = value();
    else if (arg === '--cache-dir') opts.cacheDir = value();
    else if (arg === '--disable') {
      const list = value();
      opts.disable = list === '' || list === 'none' ? [] : list.split(/[\s,]+/).filter(Boolean);
      for (const f of opts.disable) {
        if (!KNOWN_FEATURES.includes(f)) {
          throw new BuildError(`unknown feature \`${f}\` in --disable; known: ${KNOWN_FEATURES.join(', ')}`);
        }
      }
    } else if (arg === '--quiet' || arg === '-q') opts.quiet = true;
    else if (arg === '--no-typecheck') opts.typecheck = false;
    else if (arg === '-h' || arg === '--help') {
      console.log(usage());
      process.exit(0);
    } else if (arg.startsWith('-')) throw new BuildError(`unknown option ${arg}\n${usage()}`);
    else if (opts.input === undefined) opts.input = arg;
    else throw new BuildError(`more than one processor given\n${usage()}`);
  }
  if (opts.input === undefined) throw new BuildError(usage());
  return opts;
}

/** The processor's source file for a file or plugin-folder argument. */
export function sourceFile(input) {
  const path = resolve(input);
  if (!existsSync(path)) throw new BuildError(`${input} does not exist`);
  if (!statIsDir(path)) return path;
  const manifest = join(path, 'package.json');
  if (existsSync(manifest)) {
    let main;
    try {
      main = JSON.parse(readFileSync(manifest, 'utf8')).main;
    } catch (err) {
      throw new BuildError(`${manifest} is not valid JSON: ${err.message}`);
    }
    if (typeof main === 'string') {
      const file = resolve(path, main);
      if (!existsSync(file)) throw new BuildError(`${manifest} names main \`${main}\`, which does not exist`);
      return file;
    }
  }
  for (const name of ['processor.ts', 'processor.mts', 'processor.js', 'processor.mjs']) {
    if (existsSync(join(path, name))) return join(path, name);
  }
  throw new BuildError(`${input} has no processor.ts or processor.js (and no \`main\` in package.json)`);
}

function statIsDir(path) {
  try {
    return readdirSync(path) !== undefined;
  } catch {
    return false;
  }
}

/** Loads a tool installed by setup.sh, with a clear message when it is missing. */
async function tool(name) {
  try {
    return await import(name);
  } catch (err) {
    if (err.code === 'ERR_MODULE_NOT_FOUND' || err.code === 'MODULE_NOT_FOUND') {
      throw new BuildError(`${name} is not installed: run ${join(SDK_DIR, 'setup.sh')} first`);
    }
    throw err;
  }
}

/** A path for stack traces and messages: relative to the processor's folder, or the SDK's. */
function displayPath(file, baseDir) {
  const abs = resolve(file);
  if (abs.startsWith(join(SDK_DIR, 'src') + sep)) return `@statebox/sdk/${relative(SDK_DIR, abs)}`;
  const rel = relative(baseDir, abs);
  return rel.startsWith('..') ? abs : rel;
}

function formatEsbuildMessages(messages, baseDir, kind) {
  return messages
    .map((m) => {
      if (!m.location) return `${kind}: ${m.text}`;
      const { file, line, column, lineText } = m.location;
      const where = `${displayPath(resolve(SDK_DIR, file), baseDir)}:${line}:${column + 1}`;
      const caret = `${' '.repeat(column)}^`;
      return `${where}: ${kind}: ${m.text}\n    ${lineText}\n    ${caret}`;
    })
    .join('\n');
}

/**
 * Bundles the processor and the SDK into one ES module; returns its text, the line table
 * of its source map, and every source file it was made of. With `testHost`, the WIT imports
 * resolve to the test harness's in-memory host and the source map is inline (for Node).
 */
export async function bundle(source, { testHost = false } = {}) {
  const esbuild = await tool('esbuild');
  const baseDir = dirname(source);
  // The entry module is given on stdin, and the output named inside the SDK, so that no
  // temporary path reaches the bundle: the same sources always give the same bundle.
  const entry = '<statebox-entry>';
  const entrySource = [
    `import * as userModule from ${JSON.stringify(source)};`,
    `import { exportProcessor } from ${JSON.stringify(join(SDK_DIR, 'src/export.js'))};`,
    'const exported = exportProcessor(userModule.default);',
    'export const processor = exported.processor;',
    'export const batchProcessor = exported.batchProcessor;',
    '',
  ].join('\n');
  let result;
  try {
    result = await esbuild.build({
      stdin: { contents: entrySource, resolveDir: SDK_DIR, sourcefile: entry, loader: 'js' },
      bundle: true,
      format: 'esm',
      platform: 'neutral',
      target: 'es2022',
      outfile: join(SDK_DIR, BUNDLE_NAME),
      absWorkingDir: SDK_DIR,
      write: false,
      sourcemap: testHost ? 'inline' : 'external',
      metafile: true,
      sourcesContent: false,
      external: testHost ? [] : ['statebox:*'],
      plugins: testHost ? [testHostPlugin] : [],
      alias: { '@statebox/sdk': join(SDK_DIR, 'src/index.js') },
      mainFields: ['module', 'main'],
      logLevel: 'silent',
    });
  } catch (err) {
    if (Array.isArray(err.errors) && err.errors.length > 0) {
      throw new BuildError(formatEsbuildMessages(err.errors, process.cwd(), 'error'), { cause: 'formatted' });
    }
    throw err;
  }
  const warnings = [];
  for (const warning of result.warnings) {
    if (warning.location && warning.location.file.endsWith(entry)) {
      // The generated entry module reads the default export; the only warning it can get
      // is that there is none.
      throw new BuildError(
        `${displayPath(source, process.cwd())}: the processor module has no default export; ` +
          'write `export default class MyProcessor { ... }`',
      );
    }
    warnings.push(warning);
  }
  if (warnings.length > 0) console.error(formatEsbuildMessages(warnings, process.cwd(), 'warning'));
  const js = result.outputFiles.find((f) => f.path.endsWith('.js')).text;
  if (testHost) return { js };
  const map = JSON.parse(result.outputFiles.find((f) => f.path.endsWith('.map')).text);
  const sources = map.sources.map((s) => (s.endsWith(entry) ? entry : displayPath(resolve(SDK_DIR, s), baseDir)));
  // Metafile paths are relative to esbuild's working directory.
  const inputs = Object.keys(result.metafile.inputs)
    .filter((f) => !f.endsWith(entry))
    .map((f) => resolve(SDK_DIR, f));
  return { js, lines: decodeMappings(map.mappings), sources, inputs };
}

/**
 * Resolves the WIT imports (`statebox:processor/<interface>@0.1.0`) to the functions of the
 * test harness's in-memory host, which it installs as `globalThis.__stateboxTestHost` before
 * importing the bundle.
 */
const testHostPlugin = {
  name: 'statebox-test-host',
  setup(build) {
    build.onResolve({ filter: /^statebox:processor\// }, (args) => ({ path: args.path, namespace: 'statebox-test-host' }));
    build.onLoad({ filter: /.*/, namespace: 'statebox-test-host' }, (args) => {
      const iface = /^statebox:processor\/([a-z-]+)@/.exec(args.path)?.[1];
      const names = {
        handle: ['getValueState', 'getListState', 'getMapState', 'deleteIfExists', 'registerTimer', 'deleteTimer', 'listTimers', 'getQueryInfo'],
        keys: ['useKey'],
        log: ['log'],
      }[iface];
      if (!names) return { errors: [{ text: `the test harness has no interface ${args.path}` }] };
      const body = names.map((n) => `export const ${n} = (...args) => globalThis.__stateboxTestHost.${iface}.${n}(...args);`);
      return { contents: body.join('\n'), loader: 'js' };
    });
  },
};

/**
 * Type-checks the TypeScript files of the processor with the TypeScript compiler (esbuild only
 * strips types). A `tsconfig.json` next to the processor is honoured; `@statebox/sdk` always
 * resolves to this SDK's declarations.
 */
export async function typecheck(source) {
  const ts = (await tool('typescript')).default;
  const baseDir = dirname(source);
  let options = {
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.ES2022,
    moduleResolution: ts.ModuleResolutionKind.Bundler,
    strict: true,
    skipLibCheck: true,
    types: [],
  };
  const config = join(baseDir, 'tsconfig.json');
  if (existsSync(config)) {
    const parsed = ts.getParsedCommandLineOfConfigFile(config, {}, {
      ...ts.sys,
      onUnRecoverableConfigFileDiagnostic: (d) => {
        throw new BuildError(ts.flattenDiagnosticMessageText(d.messageText, '\n'));
      },
    });
    options = parsed.options;
  }
  options = {
    ...options,
    noEmit: true,
    allowImportingTsExtensions: true,
    paths: { ...(options.paths ?? {}), '@statebox/sdk': [join(SDK_DIR, 'src/index.d.ts')] },
  };
  const program = ts.createProgram([source], options);
  const errors = ts.getPreEmitDiagnostics(program).filter((d) => d.category === ts.DiagnosticCategory.Error);
  if (errors.length === 0) return;
  const text = errors
    .map((d) => {
      const message = ts.flattenDiagnosticMessageText(d.messageText, '\n');
      if (!d.file || d.start === undefined) return `error TS${d.code}: ${message}`;
      const { line, character } = d.file.getLineAndCharacterOfPosition(d.start);
      const where = `${displayPath(d.file.fileName, process.cwd())}:${line + 1}:${character + 1}`;
      return `${where}: error TS${d.code}: ${message}`;
    })
    .join('\n');
  throw new BuildError(`${text}\n(type errors; build with --no-typecheck to skip the check)`, {
    cause: 'formatted',
  });
}

const BASE64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';

/**
 * Decodes a source map's `mappings` (base64 VLQ) into, per generated line, a flat array of
 * [generated column, source index, original line, original column] per segment.
 */
function decodeMappings(mappings) {
  const lines = [];
  let source = 0;
  let origLine = 0;
  let origColumn = 0;
  for (const lineText of mappings.split(';')) {
    const segments = [];
    let genColumn = 0;
    for (const segment of lineText.split(',')) {
      if (segment === '') continue;
      const fields = [];
      let value = 0;
      let shift = 0;
      for (const ch of segment) {
        const digit = BASE64.indexOf(ch);
        value += (digit & 31) << shift;
        if (digit & 32) {
          shift += 5;
        } else {
          fields.push(value & 1 ? -(value >>> 1) : value >>> 1);
          value = 0;
          shift = 0;
        }
      }
      genColumn += fields[0];
      if (fields.length >= 4) {
        source += fields[1];
        origLine += fields[2];
        origColumn += fields[3];
        segments.push(genColumn, source, origLine, origColumn);
      }
    }
    lines.push(segments);
  }
  return lines;
}

function witText() {
  const files = readdirSync(WIT_DIR).filter((f) => f.endsWith('.wit')).sort();
  return files.map((f) => `${f}\n${readFileSync(join(WIT_DIR, f), 'utf8')}`).join('\n');
}

/** Waits for another build of the same component to finish (a lock directory), or takes the lock. */
async function lock(path) {
  const started = Date.now();
  for (;;) {
    try {
      await mkdir(path);
      return;
    } catch (err) {
      if (err.code !== 'EEXIST') throw err;
    }
    // A lock older than ten minutes belongs to a build that died.
    try {
      const { mtimeMs } = await stat(path);
      if (Date.now() - mtimeMs > 600_000) await rmdir(path).catch(() => {});
    } catch {}
    if (Date.now() - started > 900_000) throw new BuildError(`waited 15 minutes for the build lock ${path}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** The original `file:line:column` of a position in the bundle, from the line table. */
function originalPosition(table, line, column) {
  const segments = table.lines[line - 1];
  if (!segments || segments.length === 0) return undefined;
  let best = 0;
  for (let i = 0; i < segments.length; i += 4) {
    if (segments[i] <= column - 1) best = i;
    else break;
  }
  return `${table.sources[segments[best + 1]]}:${segments[best + 2] + 1}:${segments[best + 3] + 1}`;
}

/**
 * Rewrites what the engine printed when the module's top-level code threw: bundle positions
 * become the user's files and lines, and the engine's note about the rejected module promise
 * (the same error again) is dropped.
 */
function explainInitFailure(message, table) {
  const bundle = BUNDLE_NAME.replace(/[.]/g, '[.]');
  return message
    .split('\n')
    .filter((line) => !/^(Failed to initialize component|Additionally, some promises were rejected|Promise rejected but never handled)/.test(line))
    .map((line) =>
      line.replace(new RegExp(`${bundle}:(\\d+):(\\d+)`, 'g'), (whole, l, c) => originalPosition(table, Number(l), Number(c)) ?? whole),
    )
    .join('\n');
}

async function componentizeBundle(bundlePath, disable, table) {
  const { componentize } = await tool('@bytecodealliance/componentize-js');
  try {
    const { component } = await componentize({
      sourcePath: bundlePath,
      witPath: WIT_DIR,
      worldName: WORLD,
      disableFeatures: disable,
    });
    return component;
  } catch (err) {
    throw new BuildError(
      `the processor module threw while it was evaluated at build time:\n${explainInitFailure(err.message, table)}`,
    );
  }
}

/** The name of a built component: the plugin folder's, or the source file's. */
function componentName(input, source) {
  return statIsDir(resolve(input)) ? basename(resolve(input)) : basename(source, extname(source));
}

async function build(opts) {
  const started = Date.now();
  const source = sourceFile(opts.input);
  const workDir = await mkdtemp(join(tmpdir(), 'statebox-js-'));
  try {
    const { js, lines, sources, inputs } = await bundle(source);
    const table = { bundle: BUNDLE_NAME, sources, lines };
    // Appended, so that no line of the bundle moves.
    const text = `${js}\nglobalThis.__stateboxLines = ${JSON.stringify(table)};\n`;
    const { version } = await tool('@bytecodealliance/componentize-js');
    const hash = createHash('sha256')
      .update(JSON.stringify({ BUILD_FORMAT, version, disable: [...opts.disable].sort(), typecheck: opts.typecheck }))
      .update(witText())
      .update(text)
      // The sources themselves too: a change to types alone leaves the bundle as it was but
      // must be type-checked again.
      .update(inputs.map((f) => readFileSync(f, 'utf8')).join('\n'))
      .digest('hex')
      .slice(0, 32);

    let cached;
    if (opts.cacheDir) {
      await mkdir(opts.cacheDir, { recursive: true });
      // The same sources built under another name (a file, then its folder) are the same
      // component.
      const existing = readdirSync(opts.cacheDir).find((f) => f.endsWith(`-${hash}.wasm`));
      cached = join(opts.cacheDir, existing ?? `${componentName(opts.input, source)}-${hash}.wasm`);
    }
    let fromCache = false;
    let wasmPath = cached;
    if (cached && existsSync(cached)) {
      fromCache = true;
    } else {
      const lockPath = cached ? `${cached}.lock` : undefined;
      if (lockPath) await lock(lockPath);
      try {
        if (cached && existsSync(cached)) {
          fromCache = true;
        } else {
          if (opts.typecheck && /\.m?ts$/.test(source)) await typecheck(source);
          const bundlePath = join(workDir, BUNDLE_NAME);
          await writeFile(bundlePath, text);
          const component = await componentizeBundle(bundlePath, opts.disable, table);
          const target = cached ?? resolve(opts.out ?? join(dirname(source), `${basename(source, extname(source))}.wasm`));
          const tmp = `${target}.${process.pid}.tmp`;
          await writeFile(tmp, component);
          await rename(tmp, target);
          wasmPath = target;
        }
      } finally {
        if (lockPath) await rmdir(lockPath).catch(() => {});
      }
    }
    if (opts.out && resolve(opts.out) !== wasmPath) {
      await mkdir(dirname(resolve(opts.out)), { recursive: true });
      await copyFile(wasmPath, opts.out);
      wasmPath = resolve(opts.out);
    }
    const size = (await stat(wasmPath)).size;
    if (!opts.quiet) {
      const how = fromCache ? 'cached' : `built in ${((Date.now() - started) / 1000).toFixed(1)} s`;
      console.error(`${displayPath(source, process.cwd())} -> ${wasmPath} (${(size / 1048576).toFixed(1)} MiB, ${how})`);
    }
    if (!opts.out) console.log(wasmPath);
  } finally {
    await rm(workDir, { recursive: true, force: true });
  }
}

async function main() {
  try {
    await build(parseArgs(process.argv.slice(2)));
  } catch (err) {
    if (err instanceof BuildError) {
      // Compiler messages carry their own `file:line:column: error:` prefix.
      console.error(err.cause === 'formatted' ? err.message : `error: ${err.message}`);
    } else {
      console.error(err);
    }
    process.exit(1);
  }
}

// Run as a script, not imported (testing.mjs imports the bundler).
if (process.argv[1] && realpathSync(resolve(process.argv[1])) === fileURLToPath(import.meta.url)) {
  await main();
}
