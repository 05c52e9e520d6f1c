/**
 * `lathe launch` as a small bundle for the GPU machine (the CLI's bundle would carry every command):
 * the same launcher (packages/recipes/src/launch.ts), one process per rank with torchrun's variables.
 *
 * usage: node .bundle/dp-launch.js --gpus N [--master_port 29500] [--nnodes 1 --node_rank 0 --master_addr 127.0.0.1] [--grace_s 5] -- PROGRAM ARGS…
 */
import { defaults } from '../../../packages/recipes/src/options';
import { launchSchema, type LaunchConfig } from '../../../packages/recipes/src/launch-config';
import { runLaunch } from '../../../packages/recipes/src/launch';

const sep = process.argv.indexOf('--');
const own = sep < 0 ? process.argv.slice(2) : process.argv.slice(2, sep);
const command = sep < 0 ? [] : process.argv.slice(sep + 1);
const cfg: LaunchConfig = { ...defaults(launchSchema) };
for (let i = 0; i < own.length; i += 2) {
  const key = own[i].replace(/^--/, '').replace(/-/g, '_') as keyof LaunchConfig;
  if (!(key in launchSchema)) throw new Error(`unknown option ${own[i]} (options: ${Object.keys(launchSchema).map((k) => `--${k}`).join(', ')})`);
  (cfg as Record<string, unknown>)[key] = launchSchema[key].type === 'string' ? own[i + 1] : Number(own[i + 1]);
}
const stop = new AbortController();
process.on('SIGINT', () => stop.abort());
process.on('SIGTERM', () => stop.abort());
runLaunch(cfg, command, { stdout: (t) => process.stdout.write(t), stderr: (t) => process.stderr.write(t) }, stop.signal).then(
  (r) => process.exit(r.exitCode),
  (e: Error) => {
    process.stderr.write(`dp-launch: ${e.message}\n`);
    process.exit(1);
  },
);
