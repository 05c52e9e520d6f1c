#!/usr/bin/env node
/*
 * Runs the CLI from its TypeScript sources: node with tsx's loader (workspace packages resolve to
 * src/). Not through tsx's own CLI, whose signal relay kills a child that is busy mid-step.
 *
 * Signals: the CLI stops a long command after its current step on the first SIGINT or SIGTERM and
 * exits 130 or 143 (src/interrupt.ts). This wrapper waits for it, passing on a signal sent to the
 * wrapper alone (a scheduler, `docker stop`); the copies of one request count as one (a Ctrl-C also
 * reaches the CLI through the terminal's process group, `timeout` signals its command and the
 * group), and a second request kills the CLI at once, even mid-step.
 */
'use strict';
const { spawn } = require('node:child_process');
const { constants } = require('node:os');
const path = require('node:path');
const { pathToFileURL } = require('node:url');

/** Signals closer than this to the first are copies of the same request (as in src/interrupt.ts). */
const SAME_REQUEST_MS = 500;

const main = path.join(__dirname, '..', 'src', 'main.ts');
const tsx = pathToFileURL(require.resolve('tsx')).href;
const cli = spawn(process.execPath, ['--conditions=lathe-source', '--import', tsx, main, ...process.argv.slice(2)], {
  stdio: 'inherit',
  // the CLI leaves second requests to this wrapper (src/interrupt.ts, WRAPPER_PID_ENV)
  env: { ...process.env, LATHE_WRAPPER_PID: String(process.pid) },
});

let firstRequest;
let killedWith;
const onStop = (signal) => {
  const now = Date.now();
  if (firstRequest === undefined) {
    firstRequest = now;
    cli.kill(signal);
  } else if (now - firstRequest > SAME_REQUEST_MS && killedWith === undefined) {
    killedWith = signal;
    process.stderr.write(`\nlathe: second ${signal}: quitting now\n`);
    cli.kill('SIGKILL');
  }
};
process.on('SIGINT', onStop);
process.on('SIGTERM', onStop);
process.on('SIGHUP', () => cli.kill('SIGHUP'));

cli.on('error', (e) => {
  process.stderr.write(`lathe: cannot start ${process.execPath} (${e.message})\n`);
  process.exit(1);
});
cli.on('exit', (code, signal) => {
  const by = killedWith ?? signal;
  process.exit(killedWith === undefined && code !== null ? code : 128 + (constants.signals[by] ?? 0));
});
