/**
 * `lathe sft` (or with `--command rm|dpo`, `lathe rm train` or `lathe dpo`) with `--attention kernels`
 * against another `--attention` through the recipe, in one process
 * (the second run reuses the GPU the first opened through Lathe's kernels): a random Qwen3-0.6B
 * (or `--layers N` of it; `--tiny` a 2-layer toy for the CPU) trained on digit strings through the
 * built-in character tokenizer, every row exactly `--seq` tokens, so each step is [batch, seq]
 * (rm/dpo: `--batch` pairs, each two rows).
 * An attention written `kernels+ce` is `--attention kernels --logprob_kernel` (lathe sft only): the LM
 * head's log-probs through the fused cross-entropy kernels too.
 * Prints one JSON line per attention (losses, step ms) and a summary: the median step time of the
 * steps after `--warmup`, the speedup of the last attention over the first, and the largest
 * relative loss difference.
 *
 * usage: node sft-attention-check.js [--attentions flash,kernels[,kernels+ce]] [--device cuda] [--compute bfloat16]
 *          [--batch 8] [--seq 1024] [--steps 8] [--warmup 2] [--layers 28] [--tiny] [--dir /tmp/sft-attn] [--command sft|rm|dpo]
 * CPU smoke run: --device cpu --compute float32 --attentions composed,kernels --tiny --batch 2 --seq 32 --steps 3 --warmup 0
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { randomModel, type HfConfig } from '@lathe/models';
import { defaults, dpoSchema, rmTrainSchema, runDpo, runRmTrain, runSft, sftSchema, type SftConfig } from '@lathe/recipes';
import { arg, flag } from '../argv';
import { QWEN3_0_6B } from '../shapes';

const TINY: HfConfig = { ...QWEN3_0_6B, vocab_size: 64, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, max_position_embeddings: 4096 };

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function main(): Promise<void> {
  const attentions = arg('attentions', 'flash,kernels').split(',');
  const device = arg('device', 'cuda') as 'cpu' | 'cuda';
  const compute = arg('compute', device === 'cuda' ? 'bfloat16' : 'float32') as 'float32' | 'bfloat16';
  const [B, T, steps, warmup] = ['batch', 'seq', 'steps', 'warmup'].map((k, i) => Number(arg(k, ['8', '1024', '8', '2'][i])));
  const dir = arg('dir', `/tmp/sft-attn-${process.pid}`);
  mkdirSync(dir, { recursive: true });
  const hf = flag('tiny') ? TINY : { ...QWEN3_0_6B, num_hidden_layers: Number(arg('layers', String(QWEN3_0_6B.num_hidden_layers))), max_position_embeddings: Math.max(T, 4096) };
  const model = join(dir, 'model');
  randomModel(model, hf, { seed: 1 });
  // Digit strings of T − 1 characters (the tokenizer appends EOS): every row is exactly T tokens.
  const data = join(dir, 'data.jsonl');
  let s = 12345;
  const digits = (n: number) => Array.from({ length: n }, () => ((s = (s * 1103515245 + 12345) % 2 ** 31), String(s % 10))).join('');
  const command = arg('command', 'sft');
  if (!['sft', 'rm', 'dpo'].includes(command)) throw new Error(`--command ${command}: sft, rm or dpo`);
  const half = T >> 1;
  const row = () => (command === 'sft' ? { prompt: digits(half), response: digits(T - 1 - half) } : { prompt: digits(half), chosen: digits(T - 2 - half), rejected: digits(T - 2 - half) });
  writeFileSync(data, Array.from({ length: B * steps }, () => JSON.stringify(row())).join('\n') + '\n');

  const runs: { attention: string; losses: number[]; step_ms: number[]; tokens: number[] }[] = [];
  for (const attention of attentions) {
    const r = { attention, losses: [] as number[], step_ms: [] as number[], tokens: [] as number[] };
    const logprobKernel = attention.endsWith('+ce');
    if (logprobKernel && command !== 'sft') throw new Error(`--attentions ${attention}: the cross-entropy kernel is lathe sft's --logprob_kernel only`);
    const common = { model, tokenizer: 'builtin:addition', data, device, compute_dtype: compute, attention: attention.replace(/\+ce$/, '') as SftConfig['attention'], steps, batch_size: B, max_length: T, eval_examples: 0, eval_every: 0, save_every: 0, keep_last: 1, warmup_steps: 0, lr: 1e-5, seed: 1, run_dir: join(dir, `${command}-${attention}`), overwrite: true };
    const onStep = (m: { loss: number; host_ms: number; run_ms: number; tokens: number }) => (r.losses.push(m.loss), r.step_ms.push(+(m.host_ms + m.run_ms).toFixed(2)), r.tokens.push(m.tokens));
    // lathe sft has no --tokenizer flag, but its model loading reads one: the character tokenizer for the digit rows
    const sft: SftConfig & { tokenizer: string } = { ...defaults(sftSchema), ...common, overlong: 'truncate', logprob_kernel: logprobKernel };
    if (command === 'sft') await runSft(sft, { onStep });
    else if (command === 'rm') await runRmTrain({ ...defaults(rmTrainSchema), ...common }, { onStep });
    else await runDpo({ ...defaults(dpoSchema), ...common }, { onStep });
    console.log(JSON.stringify(r));
    runs.push(r);
  }
  const first = runs[0];
  const last = runs.at(-1)!;
  const timed = (r: (typeof runs)[number]) => median(r.step_ms.slice(warmup));
  const worst = Math.max(...last.losses.map((l, i) => Math.abs(l - first.losses[i]) / Math.abs(first.losses[i])));
  console.log(JSON.stringify({ summary: true, device, compute, batch: [B, T], layers: hf.num_hidden_layers, median_step_ms: Object.fromEntries(runs.map((r) => [r.attention, timed(r)])), speedup: +(timed(first) / timed(last)).toFixed(3), max_rel_loss_diff: +worst.toPrecision(3) }));
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
