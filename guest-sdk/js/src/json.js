// JSON with exact 64-bit integers.
//
// Rows, keys and state values cross the boundary as JSON text, and a Spark `long` may be any
// 64-bit integer, but a JS number is exact only up to 2^53 - 1. So an integer literal outside
// ±Number.MAX_SAFE_INTEGER parses as a `BigInt` (holding the literal's exact value), and a
// `BigInt` is written as a plain JSON integer. Every other number stays a `number`; so does
// a literal with a fraction or an exponent (`1e20`), whatever its size.
//
// Both directions cost nothing on the common path:
// - `parse`: an integer outside the safe range has at least 16 digits, so text without a
//   run of 16 digits (a native regex test) goes straight to `JSON.parse`. Otherwise a reviver
//   reads the literal's source text (`context.source`, which SpiderMonkey implements); where
//   the engine lacks it (Node.js before 21, for the test harness), a small exact parser runs.
// - `stringify`: `JSON.stringify` throws a `TypeError` on a `BigInt`; only then is the value
//   written again with `BigInt`s as raw JSON integers (`JSON.rawJSON`, or a small writer).

const MAX_SAFE = Number.MAX_SAFE_INTEGER;
/** An integer outside the safe range has at least 16 digits. */
const LONG_DIGITS = /\d{16}/;
const INTEGER = /^-?\d+$/;

/** Whether `JSON.parse` passes revivers the source text of primitives (ES2025 "JSON.parse source text access"). */
const HAS_SOURCE = (() => {
  let source;
  try {
    JSON.parse('1', (_key, value, context) => {
      source = context?.source;
      return value;
    });
  } catch {
    return false;
  }
  return source === '1';
})();

const HAS_RAW_JSON = typeof JSON.rawJSON === 'function';

function reviver(_key, value, context) {
  if (typeof value === 'number' && (value > MAX_SAFE || value < -MAX_SAFE) && INTEGER.test(context.source)) {
    return BigInt(context.source);
  }
  return value;
}

/** Parses JSON text; integers outside ±(2^53 - 1) become `BigInt`s. */
export function parse(text) {
  if (!LONG_DIGITS.test(text)) return JSON.parse(text);
  if (HAS_SOURCE) return JSON.parse(text, reviver);
  return parseExact(text);
}

/**
 * Whether a parsed value may hold `BigInt`s: `parse` gives them only for text with a run of 16
 * digits. Lets callers parse many texts at once when none of them could.
 */
export function mayHoldLongs(text) {
  return LONG_DIGITS.test(text);
}

/**
 * JSON text of a value, with `BigInt`s written as JSON integers. Returns `undefined` for values
 * with no JSON form (like `JSON.stringify`); throws `TypeError` on cycles.
 */
export function stringify(value) {
  try {
    return JSON.stringify(value);
  } catch (err) {
    if (!(err instanceof TypeError)) throw err;
  }
  // A BigInt somewhere (or a cycle, which throws again below).
  if (HAS_RAW_JSON) return JSON.stringify(value, rawBigInts);
  return writeExact(value, '');
}

function rawBigInts(_key, value) {
  return typeof value === 'bigint' ? JSON.rawJSON(value.toString()) : value;
}

// --- Fallbacks for engines without source text access or `JSON.rawJSON` (Node.js 20). ---

/** `JSON.stringify` semantics (toJSON, undefined and functions skipped), with BigInts. */
function writeExact(value, key, seen = []) {
  if (value !== null && (typeof value === 'object' || typeof value === 'bigint') && typeof value.toJSON === 'function') {
    value = value.toJSON(key);
  }
  if (typeof value === 'bigint') return value.toString();
  if (value === null || typeof value !== 'object') return JSON.stringify(value);
  if (value instanceof Number || value instanceof String || value instanceof Boolean) return JSON.stringify(value);
  if (value instanceof BigInt) return value.valueOf().toString();
  if (seen.includes(value)) throw new TypeError('cyclic object value');
  seen.push(value);
  let out;
  if (Array.isArray(value)) {
    const items = [];
    for (let i = 0; i < value.length; i++) items.push(writeExact(value[i], String(i), seen) ?? 'null');
    out = `[${items.join(',')}]`;
  } else {
    const fields = [];
    for (const k of Object.keys(value)) {
      const v = writeExact(value[k], k, seen);
      if (v !== undefined) fields.push(`${JSON.stringify(k)}:${v}`);
    }
    out = `{${fields.join(',')}}`;
  }
  seen.pop();
  return out;
}

const NUMBER = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;
const STRING = /"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"/y;
const SPACE = /[ \t\n\r]*/y;

/** A strict JSON parser that keeps integers outside the safe range exact. */
function parseExact(text) {
  let pos = 0;
  const fail = (what) => {
    throw new SyntaxError(`JSON.parse: ${what} at position ${pos}`);
  };
  const space = () => {
    SPACE.lastIndex = pos;
    SPACE.test(text);
    pos = SPACE.lastIndex;
  };
  const token = (re) => {
    re.lastIndex = pos;
    const m = re.exec(text);
    if (m === null) return undefined;
    pos = re.lastIndex;
    return m[0];
  };
  const value = () => {
    space();
    const c = text[pos];
    if (c === '{') {
      pos++;
      const obj = {};
      space();
      if (text[pos] === '}') {
        pos++;
        return obj;
      }
      for (;;) {
        space();
        const k = token(STRING);
        if (k === undefined) fail('expected a property name');
        space();
        if (text[pos++] !== ':') fail("expected ':'");
        const v = value();
        Object.defineProperty(obj, JSON.parse(k), { value: v, writable: true, enumerable: true, configurable: true });
        space();
        const d = text[pos++];
        if (d === '}') return obj;
        if (d !== ',') fail("expected ',' or '}'");
      }
    }
    if (c === '[') {
      pos++;
      const arr = [];
      space();
      if (text[pos] === ']') {
        pos++;
        return arr;
      }
      for (;;) {
        arr.push(value());
        space();
        const d = text[pos++];
        if (d === ']') return arr;
        if (d !== ',') fail("expected ',' or ']'");
      }
    }
    if (c === '"') {
      const s = token(STRING);
      if (s === undefined) fail('bad string');
      return JSON.parse(s);
    }
    const n = token(NUMBER);
    if (n !== undefined) {
      const num = Number(n);
      return (num > MAX_SAFE || num < -MAX_SAFE) && INTEGER.test(n) ? BigInt(n) : num;
    }
    for (const [word, v] of [['true', true], ['false', false], ['null', null]]) {
      if (text.startsWith(word, pos)) {
        pos += word.length;
        return v;
      }
    }
    return fail('unexpected character');
  };
  const result = value();
  space();
  if (pos !== text.length) fail('unexpected text after the value');
  return result;
}
