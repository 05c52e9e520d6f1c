/**
 * What the in-run all-reduce's path costs beside the plain trainer on one rank, with no
 * communication, on the CPU: a random Qwen3 of a small shape trained by the plain single-run step
 * (`plain`), by accumulate + apply runs through an `onGradients` hook that does nothing (`hook`), and
 * by the bucket nodes of `gradientAllReduceInGraph` over `soloInRunReducer` (`solo`). For each:
 * the median step (ms), session runs a step, the trainer's state bytes, the accumulate (or step)
 * graph's nodes and its gradient inputs, the last step's ms of each run, the bucket count, and
 * whether the losses equal plain's bitwise (`solo` − `hook`: the bucket nodes' own cost; `hook` −
 * `plain`: the split into runs). --losses prints them; --profile writes each session's ORT profile
 * to /tmp/in-run-cost-<variant>_*.json (op-type times; not for step timings).
 *
 * usage: npx tsx --conditions=lathe-source tools/bench/distributed/in-run-cost.ts [--steps 8] [--hidden 256] [--layers 4] [--vocab 8192] [--rows 4] [--seq 64] [--bucket-mb 0.25] [--losses] [--profile]
 */
import { paramSpecs, randomWeight, parseConfig, type HfConfig } from '@lathe/models';
import { Binding, Device, type HostTensor } from '@lathe/runtime';
import { sftLoss, Trainer, fullTrainableParams, type TrainerOptions } from '@lathe/train';
import { gradientAllReduceInGraph, soloInRunReducer } from '@lathe/distributed';
import { arg, flag } from '../argv';

async function main(): Promise<void> {
  const steps = Number(arg('steps', '8'));
  const hidden = Number(arg('hidden', '256'));
  const hf: HfConfig = {
    architectures: ['Qwen3ForCausalLM'],
    vocab_size: Number(arg('vocab', '8192')),
    hidden_size: hidden,
    intermediate_size: 3 * hidden,
    num_hidden_layers: Number(arg('layers', '4')),
    num_attention_heads: 4,
    num_key_value_heads: 2,
    head_dim: hidden / 4,
    rms_norm_eps: 1e-6,
    rope_theta: 10000,
    max_position_embeddings: 4096,
    tie_word_embeddings: false,
  };
  const rows = Number(arg('rows', '4'));
  const seq = Number(arg('seq', '64'));
  const config = parseConfig(hf, 'in-run-cost');
  const sample = randomWeight({ seed: 7, std: 0.02 });
  const weights = new Map(paramSpecs(config).map((s) => [s.name, sample(s) as Float32Array] as const));
  const params = fullTrainableParams(config);
  const spec = { params, loss: sftLoss(config), optimizer: { weightDecay: 0.1, maxGradNorm: 1 } };
  const device = Device.cpu();
  let runs = 0;
  let runMs: number[] = [];
  const runSync = Binding.prototype.runSync;
  Binding.prototype.runSync = function (this: Binding, ...a: Parameters<Binding['runSync']>) {
    runs++;
    const t0 = performance.now();
    runSync.apply(this, a);
    runMs.push(+(performance.now() - t0).toFixed(1));
  };
  let s = 11;
  const rand = () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0);
  const batches = Array.from({ length: steps }, () => {
    const ids = Array.from({ length: rows * seq }, () => 1 + (rand() % (Number(hf.vocab_size) - 1)));
    const i64 = (xs: number[]): HostTensor => ({ data: BigInt64Array.from(xs.map(BigInt)), dims: [rows, seq] });
    return { input_ids: i64(ids), attention_mask: i64(ids.map(() => 1)), loss_mask: i64(ids.map(() => 1)), loss_tokens: { data: Float32Array.of(rows * (seq - 1)), dims: [] } };
  });
  const bucketBytes = Number(arg('bucket-mb', '0.25')) * 1024 * 1024;
  let nodes = 0;
  const variants: Record<string, () => TrainerOptions> = {
    plain: () => ({ device }),
    hook: () => ({ device, onGradients: async () => undefined }),
    solo: () => {
      const hook = gradientAllReduceInGraph(soloInRunReducer(), device, { bucketBytes });
      return { device, inGraphGradients: { ...hook, build: (g, grads) => ((o) => ((nodes = o.length), o))(hook.build(g, grads)) } };
    },
  };
  let reference: number[] | undefined;
  for (const [name, opts] of Object.entries(variants)) {
    const trainer = Trainer.create(spec, { params: weights }, { ...opts(), session: { intraOpThreads: 2, ...(flag('profile') ? { profilePrefix: `/tmp/in-run-cost-${name}` } : {}) } });
    const graph = trainer.batchGraph;
    const ms: number[] = [];
    const losses: number[] = [];
    let stepRuns = 0;
    for (const b of batches) {
      runs = 0;
      runMs = [];
      const t0 = performance.now();
      const r = await trainer.trainStepAsync([b], 1e-4);
      ms.push(performance.now() - t0);
      stepRuns = runs;
      losses.push(r.loss);
    }
    reference ??= losses;
    const timed = ms.slice(2).sort((a, b) => a - b);
    console.log(JSON.stringify({
      variant: name,
      step_ms: +timed[Math.floor(timed.length / 2)].toFixed(1),
      runs_per_step: stepRuns,
      last_step_runs_ms: runMs,
      state_bytes: trainer.stateBytes,
      graph_nodes: graph.nodes.length,
      grad_inputs: graph.inputs.filter((t) => t.name.startsWith('grad/')).length,
      ...(name === 'solo' ? { buckets: nodes } : {}),
      losses_equal_plain: losses.every((x, i) => Object.is(x, reference![i])),
      ...(flag('losses') ? { losses } : {}),
    }));
    trainer.dispose();
  }
}

main().catch((e: Error) => {
  process.stderr.write(`${e.stack ?? e.message}\n`);
  process.exit(1);
});
