// Describing errors and log arguments for humans: JS errors with their stacks mapped back to
// the user's source files and lines.
//
// The build appends a line table of the bundle (`globalThis.__stateboxLines`): for every
// generated line, segments of [generated column, source index, original line, original
// column], from esbuild's source map. SpiderMonkey prints frames as `function@file:line:col`;
// each frame inside the bundle is rewritten to the original file.

export function formatArgs(args) {
  return args
    .map((arg) => {
      if (typeof arg === 'string') return arg;
      if (arg instanceof Error) return describeError(arg);
      try {
        return JSON.stringify(arg) ?? String(arg);
      } catch {
        return String(arg);
      }
    })
    .join(' ');
}

function originalPosition(line, column) {
  const table = globalThis.__stateboxLines;
  if (!table) return undefined;
  const segments = table.lines[line - 1];
  if (!segments || segments.length === 0) return undefined;
  // The last segment starting at or before the column (columns are 1-based in stacks).
  let best = 0;
  for (let i = 0; i < segments.length; i += 4) {
    if (segments[i] <= column - 1) best = i;
    else break;
  }
  return {
    source: table.sources[segments[best + 1]],
    line: segments[best + 2] + 1,
    column: segments[best + 3] + 1,
  };
}

function mapStack(stack) {
  const table = globalThis.__stateboxLines;
  const frames = [];
  for (const frame of String(stack).split('\n')) {
    if (frame.trim() === '') continue;
    const match = /^(.*)@(.*?):(\d+):(\d+)$/.exec(frame);
    if (!match) {
      // V8's frames (the test harness under Node, with source maps applied) are kept as
      // they are; its first line repeats the message.
      if (/^\s+at /.test(frame)) frames.push(`    ${frame.trim()}`);
      continue;
    }
    const [, fn, file, line, column] = match;
    const name = fn === '' ? '<anonymous>' : fn;
    if (table && file.endsWith(table.bundle)) {
      const pos = originalPosition(Number(line), Number(column));
      if (pos) {
        // Frames of this glue module say nothing about the user's code.
        if (pos.source.endsWith('/src/export.js')) continue;
        frames.push(`    at ${name} (${pos.source}:${pos.line}:${pos.column})`);
        continue;
      }
    }
    // Frames of the generated bindings are not the user's.
    if (!file.endsWith('.js') || file.endsWith('initializer.js')) continue;
    frames.push(`    at ${name} (${file}:${line}:${column})`);
  }
  return frames.join('\n');
}

/** An error as `Name: message` followed by its stack, in the user's files and lines. */
export function describeError(err) {
  if (err instanceof Error) {
    const head = `${err.name}: ${err.message}`;
    const stack = err.stack ? mapStack(err.stack) : '';
    let text = stack ? `${head}\n${stack}` : head;
    if (err.cause !== undefined) text += `\ncaused by: ${describeError(err.cause)}`;
    return text;
  }
  // Errors from another realm, and objects with a message and stack, are described alike.
  if (err !== null && typeof err === 'object' && typeof err.message === 'string') {
    const name = typeof err.name === 'string' ? err.name : err.constructor?.name ?? 'Error';
    const stack = typeof err.stack === 'string' ? mapStack(err.stack) : '';
    return stack ? `${name}: ${err.message}\n${stack}` : `${name}: ${err.message}`;
  }
  let text;
  try {
    text = JSON.stringify(err) ?? String(err);
  } catch {
    text = String(err);
  }
  return `a non-Error value was thrown: ${text}`;
}

