// One jest run over every package; each package's jest.config.js is a project.
/** @type {import('jest').Config} */
module.exports = {
  projects: ['<rootDir>/packages/*/jest.config.js', '<rootDir>/apps/*/jest.config.js'],
  // A project's own testTimeout is not applied in a multi-project run: without this, any test past
  // jest's default 5 s fails on a busy machine.
  testTimeout: 60000,
  // scratch files go under one folder per run, removed when it ends (tools/jest/temp-root.js)
  globalSetup: '<rootDir>/tools/jest/global-setup.js',
  globalTeardown: '<rootDir>/tools/jest/global-teardown.js',
};
