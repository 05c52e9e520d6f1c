#!/usr/bin/env node
// Runs the CLI from its TypeScript sources through tsx (workspace packages resolve to src/).
const { spawnSync } = require('node:child_process');
const path = require('node:path');
const main = path.join(__dirname, '..', 'src', 'main.ts');
const tsx = require.resolve('tsx/cli');
const r = spawnSync(process.execPath, [tsx, '--conditions=lathe-source', main, ...process.argv.slice(2)], { stdio: 'inherit' });
process.exit(r.status ?? 1);
