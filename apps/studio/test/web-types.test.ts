/** The browser side typechecks against the DOM library (the root typecheck leaves src/web out: it has no DOM types). */
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';

test('src/web typechecks', () => {
  const tsc = require.resolve('typescript/bin/tsc');
  const r = spawnSync(process.execPath, [tsc, '-p', join(__dirname, '..', 'src', 'web', 'tsconfig.json')], { encoding: 'utf8' });
  expect(r.stdout + r.stderr).toBe('');
  expect(r.status).toBe(0);
});
