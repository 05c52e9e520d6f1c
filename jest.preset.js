// Shared jest settings for every package: TypeScript through SWC, workspace packages resolved to
// their sources through the "lathe-source" export condition.
const path = require('node:path');
// Suites named *.slow.test.ts (whole-run learning checks and the heaviest end-to-end suites) stay
// out of `npm test`, which must stay near 20 minutes on 2 cores; `npm run test:slow`
// (LATHE_SLOW_TESTS=1) runs them alone, and CI runs both.
const slow = process.env.LATHE_SLOW_TESTS === '1';
/** @param {string} dir @returns {import('jest').Config} */
module.exports = (dir) => ({
  displayName: path.basename(dir),
  rootDir: dir,
  testEnvironment: path.join(__dirname, 'tools/jest/node-environment.js'),
  testEnvironmentOptions: { customExportConditions: ['lathe-source', 'node', 'node-addons'] },
  moduleNameMapper: { '^onnxruntime-node$': path.join(__dirname, 'tools/jest/onnxruntime-node-shim.js') },
  testMatch: [slow ? '<rootDir>/test/**/*.slow.test.ts' : '<rootDir>/test/**/*.test.ts'],
  testPathIgnorePatterns: slow ? ['/node_modules/'] : ['/node_modules/', '\\.slow\\.test\\.ts$'],
  transform: { '^.+\\.(t|j)s$': ['@swc/jest', { jsc: { target: 'es2022' }, module: { type: 'commonjs' } }] },
  transformIgnorePatterns: ['/node_modules/'],
  testTimeout: 60000,
});
