// Shared jest settings for every package: TypeScript through SWC, workspace packages resolved to
// their sources through the "lathe-source" export condition.
const path = require('node:path');
/** @param {string} dir @returns {import('jest').Config} */
module.exports = (dir) => ({
  displayName: path.basename(dir),
  rootDir: dir,
  testEnvironment: path.join(__dirname, 'tools/jest/node-environment.js'),
  testEnvironmentOptions: { customExportConditions: ['lathe-source', 'node', 'node-addons'] },
  moduleNameMapper: { '^onnxruntime-node$': path.join(__dirname, 'tools/jest/onnxruntime-node-shim.js') },
  testMatch: ['<rootDir>/test/**/*.test.ts'],
  transform: { '^.+\\.(t|j)s$': ['@swc/jest', { jsc: { target: 'es2022' }, module: { type: 'commonjs' } }] },
  transformIgnorePatterns: ['/node_modules/'],
  testTimeout: 60000,
});
