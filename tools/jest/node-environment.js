// Jest's node environment runs tests in a separate V8 context, so typed arrays made by native
// addons (onnxruntime-node, koffi) fail `instanceof Float32Array` checks inside the test context.
// Sharing the host's typed-array and ArrayBuffer constructors fixes that.
const { TestEnvironment } = require('jest-environment-node');

const shared = [
  'ArrayBuffer', 'SharedArrayBuffer', 'DataView', 'Buffer',
  'Int8Array', 'Uint8Array', 'Uint8ClampedArray', 'Int16Array', 'Uint16Array', 'Int32Array', 'Uint32Array',
  'Float32Array', 'Float64Array', 'BigInt64Array', 'BigUint64Array',
];

class SharedTypedArrayEnvironment extends TestEnvironment {
  constructor(config, context) {
    super(config, context);
    for (const name of shared) if (globalThis[name]) this.global[name] = globalThis[name];
  }
}

module.exports = SharedTypedArrayEnvironment;
