#!/usr/bin/env node
// A small tensord client: the stubs come from protos/tensord/v1/inference.proto at run
// time (no code generation), and a tiny CLI drives Health, Info, Predict and Generate.
//
//   node tensord-client.js [--target HOST:PORT] health [MODEL]
//   node tensord-client.js [--target HOST:PORT] info
//   node tensord-client.js [--target HOST:PORT] predict MODEL --input NAME=SPEC... [--typed]
//   node tensord-client.js [--target HOST:PORT] generate MODEL [PROMPT] [--token-ids 1,2]...
//
// The target defaults to $TENSORD_TARGET, else 127.0.0.1:50051. As a library,
// generate(client, model, options) streams token chunks as an async iterator.
// See README.md for the input syntax. Exit status: 0 success, 1 a gRPC error (printed as
// "ERROR <STATUS_NAME>: <details>" on stderr), 2 a usage error.
'use strict';

const os = require('node:os');
const path = require('node:path');
const { parseArgs } = require('node:util');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_PATH = path.resolve(__dirname, '../../protos/tensord/v1/inference.proto');
const REQUEST_ID = 'x-request-id';
const DEFAULT_TIMEOUT_S = 30;
const TARGET_ENV = 'TENSORD_TARGET';
const DEFAULT_TARGET = '127.0.0.1:50051';

const USAGE = `usage: tensord-client.js [--target HOST:PORT] [--request-id ID] [--timeout S] COMMAND
--target defaults to $${TARGET_ENV}, else ${DEFAULT_TARGET}
commands:
  health [MODEL]                      the server's (or one model's) health
  info                                the server, its devices and its models
  predict MODEL --input NAME=SPEC...  run MODEL once; SPEC is one of
      [[1, 2], [3, 4]]                a JSON array (nested for more dimensions)
      @random:1x512[:SEED]            seeded pseudo-random float32 values in [-1, 1)
    an input may name its dtype, NAME:DTYPE=SPEC (float32 by default, e.g. ids:int64=[[1, 2]]);
    NAME may hold ':' (input_1:0=[1, 2]); only a known dtype name after the last ':' is a dtype
    values must fit the dtype: integers in its range, numbers for floats, true/false for bool;
    int64 values are exact past 2^53 and may also be given as strings ("9007199254740993")
    --typed                           send and receive typed contents instead of raw_data
    --version N                       the model version (default: the newest ready one)
  generate MODEL [PROMPT]             stream tokens from a generator model, one JSON line a chunk
    --token-ids 1,15,27               the prompt as token ids instead of text
    --max-tokens N --temperature T --top-k K --top-p P --repetition-penalty R --seed S
    --stop TEXT (repeat) --ignore-eos --logprobs N --version N`;

// The integer dtypes' ranges, inclusive, as BigInt so int64's bounds are exact.
const INT_RANGES = {
  DATA_TYPE_UINT8: [0n, 255n],
  DATA_TYPE_INT8: [-128n, 127n],
  DATA_TYPE_INT16: [-32768n, 32767n],
  DATA_TYPE_INT32: [-(2n ** 31n), 2n ** 31n - 1n],
  DATA_TYPE_INT64: [-(2n ** 63n), 2n ** 63n - 1n],
};

// Per dtype: the TypedArray that holds its raw little-endian elements, the
// TensorContents field for its typed values, and how a raw element becomes a JSON value.
// FLOAT16 and BFLOAT16 have no TypedArray in Node 20: their raw bits are decoded by hand,
// and they are sent as typed contents only (the server rounds float_values to the dtype).
const DTYPES = {
  DATA_TYPE_BOOL: { array: Uint8Array, field: 'bool_values', fromRaw: (v) => v !== 0 },
  DATA_TYPE_UINT8: { array: Uint8Array, field: 'int_values' },
  DATA_TYPE_INT8: { array: Int8Array, field: 'int_values' },
  DATA_TYPE_INT16: { array: Int16Array, field: 'int_values' },
  DATA_TYPE_INT32: { array: Int32Array, field: 'int_values' },
  DATA_TYPE_INT64: { array: BigInt64Array, field: 'int64_values' },
  DATA_TYPE_FLOAT16: {
    array: Uint16Array, field: 'float_values', fromRaw: float16ToNumber, sendRaw: false,
  },
  DATA_TYPE_BFLOAT16: {
    array: Uint16Array, field: 'float_values', fromRaw: bfloat16ToNumber, sendRaw: false,
  },
  DATA_TYPE_FLOAT32: { array: Float32Array, field: 'float_values' },
  DATA_TYPE_FLOAT64: { array: Float64Array, field: 'double_values' },
  DATA_TYPE_STRING: { array: null, field: 'bytes_values' },
};

class UsageError extends Error {}

// ---------------------------------------------------------------------------------------
// The seeded generator. mulberry32 is all 32-bit integer arithmetic, so a Python twin is
// exact (see tests/e2e/test_node_client.py). Each 32-bit output u becomes
// (u - 2^31) / 2^31: an exact double in [-1, 1), then rounded to float32 (nearest-even),
// exactly as numpy's float64 -> float32 cast rounds.

function mulberry32(seed) {
  let state = seed | 0;
  return function next() {
    state = (state + 0x6d2b79f5) | 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  };
}

function randomFloat32(count, seed) {
  const next = mulberry32(seed);
  const values = new Float32Array(count);
  for (let i = 0; i < count; i++) {
    values[i] = (next() - 2 ** 31) / 2 ** 31;
  }
  return values;
}

// ---------------------------------------------------------------------------------------
// Input parsing: NAME[:DTYPE]=SPEC -> { name, dtype, shape, values (flat, C order) }.

// NAME ends at the first '='. Tensor names may hold ':' (tf2onnx's "input_1:0"), so only
// the text after the last ':' that is a known dtype name is read as the dtype:
// "input_1:0=..." is input "input_1:0" as float32, "input_1:0:int64=..." the same as int64.
function parseInput(text) {
  const equals = text.indexOf('=');
  if (equals <= 0) {
    throw new UsageError(`--input ${JSON.stringify(text)}: expected NAME=SPEC or NAME:DTYPE=SPEC`);
  }
  const head = text.slice(0, equals);
  const spec = text.slice(equals + 1);
  const colon = head.lastIndexOf(':');
  const suffix = colon > 0 ? dtypeName(head.slice(colon + 1)) : undefined;
  const name = suffix ? head.slice(0, colon) : head;
  const dtype = suffix || 'DATA_TYPE_FLOAT32';
  if (spec.startsWith('@') && !dtype.includes('FLOAT')) {
    throw new UsageError(`--input ${name}: @random makes float values; ${dtype} needs JSON`);
  }
  const { shape, values } = spec.startsWith('@')
    ? parseGenerator(spec)
    : parseJsonArray(spec, dtype === 'DATA_TYPE_INT64');
  return { name, dtype, shape, values: checkValues(name, dtype, shape, values) };
}

// "float32", "FLOAT32" and "DATA_TYPE_FLOAT32" all name DATA_TYPE_FLOAT32; anything else
// is undefined.
function dtypeName(text) {
  const upper = text.toUpperCase();
  const name = upper.startsWith('DATA_TYPE_') ? upper : `DATA_TYPE_${upper}`;
  return Object.hasOwn(DTYPES, name) ? name : undefined;
}

// Each value checked against the dtype and put in the form the encoders take: Number for
// floats and the narrow integers, BigInt for int64, boolean for bool, string for string.
// Nothing is wrapped, truncated or rounded silently: a value that does not fit is a usage
// error naming the input, the value and what the dtype takes.
function checkValues(name, dtype, shape, values) {
  return values.map((value, index) => {
    const fail = (why) => {
      const where = values.length > 1 ? ` at ${JSON.stringify(unravel(index, shape))}` : '';
      throw new UsageError(`--input ${name}: ${showValue(value)}${where} ${why}`);
    };
    return checkValue(dtype, value, fail);
  });
}

// A flat C-order index -> its index per dimension.
function unravel(index, shape) {
  const position = [];
  for (let axis = shape.length - 1; axis >= 0; axis--) {
    position.unshift(index % shape[axis]);
    index = Math.floor(index / shape[axis]);
  }
  return position;
}

// A value as the user wrote it: integer digits (an int64 literal read exactly) bare.
function showValue(value) {
  if (typeof value === 'bigint' || (typeof value === 'string' && /^-?\d+$/.test(value))) {
    return String(value);
  }
  return JSON.stringify(value) ?? String(value);
}

const FLOAT_WORDS = { NaN: NaN, Infinity: Infinity, '-Infinity': -Infinity, '-0': -0 };

function checkValue(dtype, value, fail) {
  const short = dtype.slice('DATA_TYPE_'.length).toLowerCase();
  if (dtype === 'DATA_TYPE_STRING') {
    if (value === null || typeof value === 'object') {
      fail('is not a string: string takes JSON strings (numbers and booleans are printed)');
    }
    return String(value);
  }
  if (dtype === 'DATA_TYPE_BOOL') {
    if (typeof value === 'boolean') {
      return value;
    }
    if (value === 0 || value === 1) {
      return value === 1;
    }
    fail('is not a bool: bool takes true, false, 0 or 1');
  }
  if (Object.hasOwn(INT_RANGES, dtype)) {
    const [low, high] = INT_RANGES[dtype];
    const range = `${short} takes integers from ${low} to ${high}`;
    let integer;
    if (typeof value === 'number') {
      if (!Number.isInteger(value)) {
        fail(`is not an integer: ${range}`);
      }
      if (!Number.isSafeInteger(value) && dtype === 'DATA_TYPE_INT64') {
        fail(
          'is past 2^53 and may have been rounded: write int64 values past 2^53 as plain ' +
            'digits or as a JSON string, e.g. "9007199254740993"',
        );
      }
      integer = BigInt(value);
    } else if (typeof value === 'bigint') {
      integer = value;
    } else if (typeof value === 'string' && /^-?\d+$/.test(value)) {
      integer = BigInt(value); // a decimal string: exact at any size
    } else {
      fail(`is not an integer: ${range}`);
    }
    if (integer < low || integer > high) {
      fail(`is out of range: ${range}`);
    }
    return dtype === 'DATA_TYPE_INT64' ? integer : Number(integer);
  }
  // FLOAT16, BFLOAT16, FLOAT32, FLOAT64.
  let number = value;
  if (typeof value === 'string' && Object.hasOwn(FLOAT_WORDS, value)) {
    number = FLOAT_WORDS[value]; // as printed: "NaN", "Infinity", "-Infinity", "-0"
  } else if (typeof value !== 'number') {
    fail(`is not a number: ${short} takes numbers (or "NaN", "Infinity", "-Infinity", "-0")`);
  }
  // float16 and bfloat16 travel as float32 (float_values) too; the server rounds them.
  const overflows = Number.isFinite(number) && !Number.isFinite(Math.fround(number));
  if (dtype !== 'DATA_TYPE_FLOAT64' && overflows) {
    const carrier = dtype === 'DATA_TYPE_FLOAT32' ? '' : ` (sent as float32)`;
    fail(`is out of range: ${short}${carrier} takes finite values up to about 3.4e38`);
  }
  return number;
}

// "@random:1x512:7" -> shape [1, 512], seed 7 (0 when left out).
function parseGenerator(spec) {
  const match = /^@random:(\d+(?:x\d+)*)(?::(\d+))?$/.exec(spec);
  if (!match) {
    throw new UsageError(`${JSON.stringify(spec)}: expected @random:DIMxDIM...[:SEED]`);
  }
  const shape = match[1].split('x').map(Number);
  const seed = Number(match[2] || 0);
  if (seed > 0xffffffff) {
    throw new UsageError(`seed ${seed} is over 2^32 - 1`);
  }
  return { shape, values: Array.from(randomFloat32(elementCount(shape), seed)) };
}

// A JSON value -> shape and flat values. With exactIntegers (int64), bare integer literals
// are read as their digits rather than as doubles, so values past 2^53 are not rounded.
function parseJsonArray(spec, exactIntegers = false) {
  let value;
  try {
    value = JSON.parse(spec);
  } catch (err) {
    throw new UsageError(`${JSON.stringify(spec)} is not JSON: ${err.message}`);
  }
  if (exactIntegers) {
    value = JSON.parse(quoteIntegerLiterals(spec));
  }
  const shape = shapeOf(value);
  return { shape, values: shape.length === 0 ? [value] : value.flat(Infinity) };
}

// The shape of nested JSON arrays; a ragged array is an error, a bare value is a scalar.
function shapeOf(value) {
  if (!Array.isArray(value)) {
    return [];
  }
  const inner = value.length > 0 ? shapeOf(value[0]) : [];
  for (const item of value) {
    if (JSON.stringify(shapeOf(item)) !== JSON.stringify(inner)) {
      throw new UsageError('the JSON array is ragged: every row needs the same shape');
    }
  }
  return [value.length, ...inner];
}

// Valid JSON text with every bare integer literal (no fraction, no exponent) turned into a
// JSON string of its digits. A token is either a whole string literal, left as it is, or a
// number literal; true, false and null hold no digits.
function quoteIntegerLiterals(json) {
  return json.replace(/"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g, (token) =>
    /^-?\d+$/.test(token) ? `"${token}"` : token,
  );
}

function elementCount(shape) {
  return shape.reduce((product, dim) => product * dim, 1);
}

// ---------------------------------------------------------------------------------------
// Encoding a request tensor.

// values may be raw JSON values: they are checked (and put in shape) again here, so a
// caller of this module gets the same usage errors as the command line.
function encodeTensor({ name, dtype, shape, values: given }, typed) {
  const values = checkValues(name, dtype, shape, given);
  const tensor = { name, dtype, shape: shape.map(String) };
  if (typed) {
    tensor.contents = { [DTYPES[dtype].field]: values.map((v) => toContentsValue(dtype, v)) };
  } else {
    tensor.raw_data = encodeRaw(dtype, values);
  }
  return tensor;
}

function toContentsValue(dtype, value) {
  if (dtype === 'DATA_TYPE_STRING') {
    return Buffer.from(String(value), 'utf8');
  }
  if (dtype === 'DATA_TYPE_INT64') {
    return value.toString(); // a decimal string keeps int64 values past 2^53 exact
  }
  return value;
}

// The elements as little-endian C-order bytes; STRING elements are length-prefixed.
function encodeRaw(dtype, values) {
  if (dtype === 'DATA_TYPE_STRING') {
    return Buffer.concat(values.map((v) => lengthPrefixed(Buffer.from(String(v), 'utf8'))));
  }
  const { array: ArrayType, sendRaw = true } = DTYPES[dtype];
  if (!sendRaw) {
    throw new UsageError(`${dtype} inputs can only be sent as typed contents: add --typed`);
  }
  // checkValues has made every value fit ArrayType, so nothing here wraps or truncates.
  const elements =
    dtype === 'DATA_TYPE_INT64' ? BigInt64Array.from(values) : ArrayType.from(values, Number);
  return Buffer.from(elements.buffer, elements.byteOffset, elements.byteLength);
}

function lengthPrefixed(bytes) {
  const prefix = Buffer.alloc(4);
  prefix.writeUInt32LE(bytes.length);
  return Buffer.concat([prefix, bytes]);
}

// ---------------------------------------------------------------------------------------
// Decoding a response tensor to { dtype, shape, values (flat, C order) }.

function decodeTensor(tensor) {
  const shape = tensor.shape.map(Number);
  const values =
    tensor.data === 'contents'
      ? decodeContents(tensor.dtype, tensor.contents)
      : decodeRaw(tensor.dtype, tensor.raw_data || Buffer.alloc(0), elementCount(shape));
  return { dtype: tensor.dtype, shape, values };
}

function decodeContents(dtype, contents) {
  const values = contents[DTYPES[dtype].field];
  return dtype === 'DATA_TYPE_STRING' ? values.map((b) => b.toString('utf8')) : values;
}

function decodeRaw(dtype, bytes, count) {
  if (dtype === 'DATA_TYPE_STRING') {
    return splitLengthPrefixed(bytes, count);
  }
  const { array: ArrayType, fromRaw = (v) => v } = DTYPES[dtype];
  if (bytes.length !== count * ArrayType.BYTES_PER_ELEMENT) {
    throw new Error(`${dtype} raw_data holds ${bytes.length} bytes, expected ${count} elements`);
  }
  // Copy first: a TypedArray view needs an offset aligned to its element size, and the
  // gRPC message buffer guarantees none.
  const elements = new ArrayType(new Uint8Array(bytes).buffer);
  return Array.from(elements, fromRaw);
}

function splitLengthPrefixed(bytes, count) {
  const values = [];
  let offset = 0;
  for (let i = 0; i < count; i++) {
    const length = bytes.readUInt32LE(offset);
    values.push(bytes.toString('utf8', offset + 4, offset + 4 + length));
    offset += 4 + length;
  }
  return values;
}

// IEEE 754 half precision bits -> Number (exact: every half value is a double).
function float16ToNumber(bits) {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const fraction = bits & 0x3ff;
  if (exponent === 0) {
    return sign * fraction * 2 ** -24; // zero and subnormals
  }
  if (exponent === 0x1f) {
    return fraction ? NaN : sign * Infinity;
  }
  return sign * (1 + fraction / 1024) * 2 ** (exponent - 15);
}

// bfloat16 is the upper half of a float32.
function bfloat16ToNumber(bits) {
  const scratch = new Uint32Array([bits << 16]);
  return new Float32Array(scratch.buffer)[0];
}

// ---------------------------------------------------------------------------------------
// gRPC plumbing.

let definition;

function loadDefinition() {
  definition ??= protoLoader.loadSync(PROTO_PATH, {
    keepCase: true,
    longs: String, // int64 fields arrive as decimal strings: nothing past 2^53 is rounded
    enums: String,
    defaults: true,
    oneofs: true, // adds tensor.data: 'raw_data' | 'contents', naming the set member
  });
  return definition;
}

function loadService() {
  return grpc.loadPackageDefinition(loadDefinition()).tensord.v1.InferenceService;
}

// One unary call -> { response, trailers }. The callback runs before the 'status' event,
// so the promise settles on the status, when the trailing metadata is known.
function unaryCall(client, method, request, metadata, timeoutS) {
  const deadline = new Date(Date.now() + timeoutS * 1000);
  return new Promise((resolve, reject) => {
    let response;
    const call = client[method](request, metadata, { deadline }, (err, reply) => {
      if (err) {
        reject(err);
      } else {
        response = reply;
      }
    });
    call.on('status', (status) => {
      if (status.code === grpc.status.OK) {
        resolve({ response, trailers: status.metadata });
      }
    });
  });
}

function requestMetadata(requestId) {
  const metadata = new grpc.Metadata();
  if (requestId !== undefined) {
    metadata.set(REQUEST_ID, requestId);
  }
  return metadata;
}

// The output object, with the echoed request id when the server sent one.
function withRequestId(result, trailers) {
  const [requestId] = trailers.get(REQUEST_ID);
  return requestId === undefined ? result : { ...result, request_id: String(requestId) };
}

// ---------------------------------------------------------------------------------------
// Commands: each returns the object to print.

async function health(client, options, args) {
  const { response, trailers } = await call(client, 'Health', { model: args[0] || '' }, options);
  return withRequestId(response, trailers);
}

async function info(client, options) {
  const { response, trailers } = await call(client, 'Info', {}, options);
  return withRequestId(response, trailers);
}

async function predict(client, options, args) {
  if (args.length !== 1) {
    throw new UsageError('predict takes one MODEL');
  }
  if (options.input.length === 0) {
    throw new UsageError('predict needs at least one --input NAME=SPEC');
  }
  const request = {
    model: args[0],
    version: options.version,
    inputs: options.input.map((text) => encodeTensor(parseInput(text), options.typed)),
    output_encoding: options.typed ? 'TENSOR_ENCODING_CONTENTS' : 'TENSOR_ENCODING_RAW',
  };
  const { response, trailers } = await call(client, 'Predict', request, options);
  const outputs = {};
  for (const tensor of response.outputs) {
    outputs[tensor.name] = decodeTensor(tensor);
  }
  const result = { model: response.model, version: Number(response.version), outputs };
  return withRequestId(result, trailers);
}

function call(client, method, request, options) {
  const metadata = requestMetadata(options['request-id']);
  return unaryCall(client, method, request, metadata, options.timeout);
}

// ---------------------------------------------------------------------------------------
// Generate: a server stream of token chunks, as the Python client's generate() gives them.

// The SamplingParams fields, read from the .proto: a misspelt one is an error, not ignored.
let samplingFields;

function generateRequest(model, prompt, tokenIds, version, sampling) {
  samplingFields ??= new Set(
    loadDefinition()['tensord.v1.SamplingParams'].type.field.map((field) => field.name),
  );
  const unknown = Object.keys(sampling).filter((key) => !samplingFields.has(key));
  if (unknown.length > 0) {
    const known = [...samplingFields].join(', ');
    throw new UsageError(`unknown sampling field(s) ${unknown.join(', ')}; expected ${known}`);
  }
  const fields = Object.fromEntries(Object.entries(sampling).filter(([, v]) => v !== undefined));
  if (typeof fields.stop === 'string') {
    fields.stop = [fields.stop]; // one stop sequence
  }
  if (typeof fields.stop_token_ids === 'number') {
    fields.stop_token_ids = [fields.stop_token_ids];
  }
  return {
    model,
    version: String(version),
    prompt: prompt ?? '',
    prompt_token_ids: tokenIds === undefined ? [] : Array.from(tokenIds, Number),
    sampling: fields,
  };
}

// A GenerateResponse as plain values, named as the Python client names them: finish_reason
// is 'STOP' or 'LENGTH' on the last chunk (null before it), usage likewise.
function toChunk(message) {
  const reason = message.finish_reason.replace(/^FINISH_REASON_/, '');
  return {
    index: message.index,
    token_ids: message.token_ids,
    text: message.text,
    logprobs: message.logprobs.map((lp) => ({
      token_id: lp.token_id,
      logprob: lp.logprob,
      top: lp.top.map((t) => ({ token_id: t.token_id, logprob: t.logprob })),
    })),
    finish_reason: reason === 'UNSPECIFIED' ? null : reason,
    usage: message.usage,
  };
}

// Start a Generate call and return its chunks as an async iterator:
//
//   for await (const chunk of generate(client, 'tinylm', { prompt: 'Once upon a time',
//                                                          max_tokens: 32 })) { ... }
//
// options: prompt or token_ids, version, timeout (seconds, the deadline counts from this
// call), request_id, and any SamplingParams field (max_tokens, temperature, top_k, top_p,
// repetition_penalty, seed, stop, stop_token_ids, ignore_eos, logprobs). Bad options throw
// here. A failed call rejects the iteration with the gRPC error ({ code, details,
// metadata }); chunks already received stay valid. Leaving the loop early (break, return,
// throw) cancels the call, and the server frees the sequence.
function generate(client, model, options = {}) {
  const {
    prompt,
    token_ids: tokenIds,
    version = 0,
    timeout = DEFAULT_TIMEOUT_S,
    request_id: requestId,
    ...sampling
  } = options;
  const request = generateRequest(model, prompt, tokenIds, version, sampling);
  const deadline = new Date(Date.now() + timeout * 1000);
  const stream = client.Generate(request, requestMetadata(requestId), { deadline });
  return chunks(stream);
}

async function* chunks(stream) {
  try {
    for await (const message of stream) {
      yield toChunk(message);
    }
  } finally {
    stream.cancel(); // a no-op once the call has ended
  }
}

// The command: one JSON line per chunk, printed as it arrives.
async function generateCommand(client, options, args) {
  if (args.length < 1 || args.length > 2) {
    throw new UsageError('generate takes MODEL and an optional PROMPT');
  }
  const [model, prompt] = args;
  if ((prompt === undefined) === (options['token-ids'] === undefined)) {
    throw new UsageError('generate needs a PROMPT or --token-ids, not both');
  }
  const sampling = {
    max_tokens: integerOption(options, 'max-tokens'),
    temperature: numberOption(options, 'temperature'),
    top_k: integerOption(options, 'top-k'),
    top_p: numberOption(options, 'top-p'),
    repetition_penalty: numberOption(options, 'repetition-penalty'),
    seed: integerOption(options, 'seed'),
    stop: options.stop.length > 0 ? options.stop : undefined,
    ignore_eos: options['ignore-eos'] || undefined,
    logprobs: integerOption(options, 'logprobs'),
  };
  const stream = generate(client, model, {
    prompt,
    token_ids: options['token-ids'] === undefined ? undefined : tokenIdList(options['token-ids']),
    version: options.version,
    timeout: options.timeout,
    request_id: options['request-id'],
    ...sampling,
  });
  for await (const chunk of stream) {
    process.stdout.write(`${JSON.stringify(chunk)}\n`);
  }
  return undefined; // printed as it came
}

function tokenIdList(text) {
  if (!/^\d+(,\d+)*$/.test(text)) {
    throw new UsageError(`--token-ids ${text}: expected comma-separated integers such as 1,15,27`);
  }
  return text.split(',').map(Number);
}

function numberOption(options, name) {
  const text = options[name];
  if (text === undefined) {
    return undefined;
  }
  const value = Number(text);
  if (text.trim() === '' || !Number.isFinite(value)) {
    throw new UsageError(`--${name} ${text}: expected a number`);
  }
  return value;
}

function integerOption(options, name) {
  const value = numberOption(options, name);
  if (value !== undefined && !Number.isSafeInteger(value)) {
    throw new UsageError(`--${name} ${options[name]}: expected an integer`);
  }
  return value;
}

const COMMANDS = { health, info, predict, generate: generateCommand };

// ---------------------------------------------------------------------------------------
// The command line.

function parseCommandLine(argv) {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      target: { type: 'string' },
      'request-id': { type: 'string' },
      timeout: { type: 'string', default: String(DEFAULT_TIMEOUT_S) },
      input: { type: 'string', multiple: true, default: [] },
      typed: { type: 'boolean', default: false },
      version: { type: 'string', default: '0' },
      'token-ids': { type: 'string' },
      'max-tokens': { type: 'string' },
      temperature: { type: 'string' },
      'top-k': { type: 'string' },
      'top-p': { type: 'string' },
      'repetition-penalty': { type: 'string' },
      seed: { type: 'string' },
      stop: { type: 'string', multiple: true, default: [] },
      'ignore-eos': { type: 'boolean', default: false },
      logprobs: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  const [command, ...args] = positionals;
  if (values.help) {
    return { help: true };
  }
  const target = values.target || process.env[TARGET_ENV] || DEFAULT_TARGET;
  if (!(command in COMMANDS)) {
    throw new UsageError(command ? `unknown command ${JSON.stringify(command)}` : 'no command');
  }
  const timeout = Number(values.timeout);
  if (!(timeout > 0)) {
    throw new UsageError(`--timeout ${values.timeout}: expected a positive number of seconds`);
  }
  if (!/^\d+$/.test(values.version)) {
    throw new UsageError(`--version ${values.version}: expected a non-negative integer`);
  }
  return { command, args, options: { ...values, target, timeout } };
}

// JSON cannot carry BigInt, NaN, the infinities or -0; they are printed as strings
// ("-0", "NaN", "Infinity", "-Infinity", int64 digits), as the proto3 JSON mapping does.
function jsonValue(_key, value) {
  if (typeof value === 'bigint') {
    return value.toString();
  }
  if (typeof value === 'number' && (!Number.isFinite(value) || Object.is(value, -0))) {
    return Object.is(value, -0) ? '-0' : String(value);
  }
  return value;
}

function statusName(code) {
  return grpc.status[code] || `UNKNOWN_CODE_${code}`;
}

async function main(argv) {
  let parsed;
  try {
    parsed = parseCommandLine(argv);
  } catch (err) {
    process.stderr.write(`usage error: ${err.message}\n${USAGE}\n`);
    return 2;
  }
  if (parsed.help) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  const InferenceService = loadService();
  const client = new InferenceService(parsed.options.target, grpc.credentials.createInsecure());
  try {
    const result = await COMMANDS[parsed.command](client, parsed.options, parsed.args);
    if (result !== undefined) {
      process.stdout.write(`${JSON.stringify(result, jsonValue)}\n`);
    }
    return 0;
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`usage error: ${err.message}\n`);
      return 2;
    }
    if (typeof err.code === 'number') {
      process.stderr.write(`ERROR ${statusName(err.code)}: ${err.details}\n`);
      return 1;
    }
    throw err;
  } finally {
    client.close();
  }
}

// Raw tensors are little-endian; TypedArrays use the host's byte order.
if (os.endianness() !== 'LE') {
  throw new Error('tensord-client.js needs a little-endian host');
}

if (require.main === module) {
  main(process.argv.slice(2)).then((code) => {
    process.exitCode = code;
  });
}

module.exports = {
  mulberry32,
  randomFloat32,
  loadService,
  generate,
  encodeTensor,
  decodeTensor,
  parseInput,
  UsageError,
};
