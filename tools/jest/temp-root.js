// Every test run writes its scratch files (models, checkpoints, run folders: hundreds of MB for
// the CLI suites) under one folder of its own, removed when the run ends, so a run never leaves
// them in the machine's temp folder. globalSetup points TMPDIR there before jest starts its
// workers, which inherit it, as do the CLI processes the tests spawn; globalTeardown removes it,
// and the next run removes what a killed run left.
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const PREFIX = 'lathe-test-run-';

/** Whether a process with this id still runs. */
function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return e.code === 'EPERM';
  }
}

async function setup() {
  const base = os.tmpdir();
  for (const name of fs.readdirSync(base)) {
    const pid = Number(name.startsWith(PREFIX) ? name.slice(PREFIX.length).split('-')[0] : NaN);
    if (Number.isInteger(pid) && !alive(pid)) fs.rmSync(path.join(base, name), { recursive: true, force: true });
  }
  const root = fs.mkdtempSync(path.join(base, `${PREFIX}${process.pid}-`));
  // the same mode as /tmp: the code sandbox's other user must reach the folders made inside it
  fs.chmodSync(root, 0o1777);
  process.env.LATHE_TEST_TEMP_ROOT = root;
  process.env.TMPDIR = root;
}

async function teardown() {
  const root = process.env.LATHE_TEST_TEMP_ROOT;
  if (root) fs.rmSync(root, { recursive: true, force: true });
}

module.exports = { setup, teardown };
