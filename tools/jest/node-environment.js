// Jest's node environment runs each test file in a separate V8 context with its own module
// registry. Two problems follow for native addons, both fixed here:
// 1. Typed arrays made by addons fail `instanceof Float32Array` inside the test context: share
//    the host's typed-array and ArrayBuffer constructors.
// 2. onnxruntime-node's binding aborts the process when it is initialised twice (a second test
//    file in the same worker re-evaluates it): load it once per worker process, outside the
//    registry, and hand it to the tests through a global (see onnxruntime-node-shim.js).
const { TestEnvironment } = require('jest-environment-node');

const shared = [
  'ArrayBuffer', 'SharedArrayBuffer', 'DataView', 'Buffer',
  'Int8Array', 'Uint8Array', 'Uint8ClampedArray', 'Int16Array', 'Uint16Array', 'Int32Array', 'Uint32Array',
  'Float32Array', 'Float64Array', 'BigInt64Array', 'BigUint64Array',
];

let onnxruntime;

class SharedNativeEnvironment extends TestEnvironment {
  constructor(config, context) {
    super(config, context);
    for (const name of shared) if (globalThis[name]) this.global[name] = globalThis[name];
    const g = this.global;
    Object.defineProperty(g, '__latheOnnxruntimeNode', {
      get: () => (onnxruntime ??= require('onnxruntime-node')),
    });
  }
}

module.exports = SharedNativeEnvironment;
