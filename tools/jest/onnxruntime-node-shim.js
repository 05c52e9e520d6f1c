// Resolves `onnxruntime-node` inside tests to the single per-worker instance loaded by
// node-environment.js (the native binding cannot be initialised twice in one process).
module.exports = globalThis.__latheOnnxruntimeNode;
