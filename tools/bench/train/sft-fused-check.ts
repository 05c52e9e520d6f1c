/**
 * `lathe sft` on the GPU through the recipe (the built-in demo task and model, float32): the run
 * opens the GPU through Lathe's kernels, so its Trainer takes the fused AdamW update by default.
 * Run twice — as is, and with LATHE_FUSED_ADAMW=0 — and compare the printed losses: the two
 * updates do the same arithmetic (the global norm summed in another order), so the losses agree
 * to float32 rounding.
 *
 * usage: node sft-fused-check.js [--steps 30] [--run-dir /tmp/sft-fused]
 * Prints one JSON line: fused (whether the device has Lathe's compute stream), losses, seconds.
 */
import { Device } from '@lathe/runtime';
import { defaults, runSft, sftSchema } from '@lathe/recipes';
import { arg } from '../argv';

async function main(): Promise<void> {
  const losses: number[] = [];
  const t0 = performance.now();
  const steps = Number(arg('steps', '30'));
  await runSft({ ...defaults(sftSchema), device: 'cuda', steps, eval_examples: 0, eval_every: 0, save_every: 0, log_every: steps, run_dir: arg('run-dir', `/tmp/sft-fused-${process.pid}`) }, { onStep: (m) => losses.push(m.loss) });
  const fused = Device.open('cuda').computeStream !== undefined && process.env.LATHE_FUSED_ADAMW !== '0';
  console.log(JSON.stringify({ fused, steps, losses, seconds: (performance.now() - t0) / 1000 }));
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
