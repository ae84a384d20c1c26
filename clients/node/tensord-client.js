#!/usr/bin/env node
// A small tensord client: the stubs come from protos/tensord/v1/inference.proto at run
// time (no code generation), and a tiny CLI drives Health, Info and Predict.
//
//   node tensord-client.js --target HOST:PORT health [MODEL]
//   node tensord-client.js --target HOST:PORT info
//   node tensord-client.js --target HOST:PORT predict MODEL --input NAME=SPEC... [--typed]
//
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

const USAGE = `usage: tensord-client.js --target HOST:PORT [--request-id ID] [--timeout S] COMMAND
commands:
  health [MODEL]                      the server's (or one model's) health
  info                                the server, its devices and its models
  predict MODEL --input NAME=SPEC...  run MODEL once; SPEC is one of
      [[1, 2], [3, 4]]                a JSON array (nested for more dimensions)
      @random:1x512[:SEED]            seeded pseudo-random float32 values in [-1, 1)
    an input may name its dtype, NAME:DTYPE=SPEC (float32 by default, e.g. ids:int64=[[1, 2]])
    --typed                           send and receive typed contents instead of raw_data
    --version N                       the model version (default: the newest ready one)`;

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
  DATA_TYPE_INT64: { array: BigInt64Array, field: 'int64_values', toRaw: BigInt },
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

function parseInput(text) {
  const match = /^([^=:]+)(?::([A-Za-z0-9_]+))?=(.*)$/s.exec(text);
  if (!match) {
    throw new UsageError(`--input ${JSON.stringify(text)}: expected NAME=SPEC or NAME:DTYPE=SPEC`);
  }
  const [, name, dtypeText, spec] = match;
  const dtype = dtypeName(dtypeText || 'float32');
  if (spec.startsWith('@') && !dtype.includes('FLOAT')) {
    throw new UsageError(`--input ${name}: @random makes float values; ${dtype} needs JSON`);
  }
  const { shape, values } = spec.startsWith('@') ? parseGenerator(spec) : parseJsonArray(spec);
  return { name, dtype, shape, values };
}

// "float32", "FLOAT32" and "DATA_TYPE_FLOAT32" all name DATA_TYPE_FLOAT32.
function dtypeName(text) {
  const upper = text.toUpperCase();
  const name = upper.startsWith('DATA_TYPE_') ? upper : `DATA_TYPE_${upper}`;
  if (!(name in DTYPES)) {
    throw new UsageError(`unknown dtype ${JSON.stringify(text)}`);
  }
  return name;
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

function parseJsonArray(spec) {
  let value;
  try {
    value = JSON.parse(spec);
  } catch (err) {
    throw new UsageError(`${JSON.stringify(spec)} is not JSON: ${err.message}`);
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

function elementCount(shape) {
  return shape.reduce((product, dim) => product * dim, 1);
}

// ---------------------------------------------------------------------------------------
// Encoding a request tensor.

function encodeTensor({ name, dtype, shape, values }, typed) {
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
    return String(value); // a decimal string keeps int64 values past 2^53 exact
  }
  return value;
}

// The elements as little-endian C-order bytes; STRING elements are length-prefixed.
function encodeRaw(dtype, values) {
  if (dtype === 'DATA_TYPE_STRING') {
    return Buffer.concat(values.map((v) => lengthPrefixed(Buffer.from(String(v), 'utf8'))));
  }
  const { array: ArrayType, toRaw = Number, sendRaw = true } = DTYPES[dtype];
  if (!sendRaw) {
    throw new UsageError(`${dtype} inputs can only be sent as typed contents: add --typed`);
  }
  const elements = ArrayType.from(values, toRaw);
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

function loadService() {
  const definition = protoLoader.loadSync(PROTO_PATH, {
    keepCase: true,
    longs: String, // int64 fields arrive as decimal strings: nothing past 2^53 is rounded
    enums: String,
    defaults: true,
    oneofs: true, // adds tensor.data: 'raw_data' | 'contents', naming the set member
  });
  return grpc.loadPackageDefinition(definition).tensord.v1.InferenceService;
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

const COMMANDS = { health, info, predict };

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
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  const [command, ...args] = positionals;
  if (values.help) {
    return { help: true };
  }
  if (!values.target) {
    throw new UsageError('--target HOST:PORT is required');
  }
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
  return { command, args, options: { ...values, timeout } };
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
    process.stdout.write(`${JSON.stringify(result, jsonValue)}\n`);
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

module.exports = { mulberry32, randomFloat32, loadService, encodeTensor, decodeTensor, parseInput };
