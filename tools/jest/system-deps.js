// Jest global setup of the projects whose tests run the code sandbox (packages/graders): makes sure
// its system packages are there before any test starts, installing them as root with apt-get
// (tools/setup/system-deps.sh), or stops the run at once with the one command that fixes it, rather
// than letting every sandbox test fail as a bare 'sandbox-error'.
const { spawnSync } = require('node:child_process');
const path = require('node:path');

module.exports = function systemDeps() {
  const script = path.join(__dirname, '..', 'setup', 'system-deps.sh');
  const r = spawnSync('bash', [script], { stdio: ['ignore', 'inherit', 'pipe'], encoding: 'utf8' });
  const lines = (r.stderr ?? '').trim().split('\n').filter(Boolean);
  if (r.status === 0) {
    if (lines.length) process.stderr.write(`${lines.join('\n')}\n`);
    return;
  }
  // the script's last line is the fix; anything before it (apt-get's errors) is shown above it
  const why = r.error ? `could not run ${script}: ${r.error.message}` : (lines.pop() ?? `${script} exited with ${r.status}`);
  if (lines.length) process.stderr.write(`${lines.join('\n')}\n`);
  const error = new Error(why);
  error.stack = why; // the fix is the whole message; a stack through jest's loader adds nothing
  throw error;
};
