/**
 * The extra cost of LUFFY's off-policy traces and of PPO's value model over a GRPO step, in one
 * process on one device: the same random decoder, prompts and sampling, stepped as
 *   grpo   G samples per prompt (estimator grpo);
 *   luffy  G − 1 samples + 1 off-policy trace of --new-tokens tokens per prompt (LUFFY's recipe:
 *          dr_grpo, the shaped off-policy term, no clip, token-sum-norm, entropy 0.001);
 *   ppo    G samples per prompt, estimator gae with a value model of separate weights (its scoring
 *          pass and its updates on top of the policy's);
 *   ppo-shared  the same with the value head on the policy's trunk (values from the policy's
 *          scoring pass, one train step for both).
 * Each method gets its own trainer (disposed before the next), --warmup untimed steps, then --steps
 * timed ones. Prints one JSON line per timed step and a summary line per method, then one line of
 * ratios to GRPO (step, scoring and training time).
 *
 * usage: node luffy-ppo-step.js [--device cuda|cpu] [--compute float32|bfloat16] [--shape tiny|qwen3-0.6b]
 *          [--prompts 64] [--group 8] [--prompt-len 64] [--new-tokens 512] [--steps 1] [--warmup 1]
 *          [--minibatches 4] [--micro-batches 1] [--methods grpo,luffy,ppo,ppo-shared] [--attention composed|flash] [--recompute]
 * Bundle for the GPU machine: add `[luffy-ppo-step]=tools/bench/grpo/luffy-ppo-step.ts` to
 * tools/bench/build-device-bundles.sh's entries. On CPU the tiny shape takes a few seconds:
 *   npx tsx --conditions=lathe-source tools/bench/grpo/luffy-ppo-step.ts --device cpu --shape tiny --prompts 4 --new-tokens 16 --prompt-len 8
 */
import { CausalLM, type HfConfig } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { combineRewards, GrpoTrainer, type GrpoStepMetrics, type GrpoTrainerOptions, type RlPrompt } from '@lathe/grpo';
import { arg, flag } from '../argv';
import { QWEN3_0_6B } from '../shapes';

const SHAPES: Record<string, HfConfig> = {
  tiny: { architectures: ['Qwen3ForCausalLM'], vocab_size: 512, hidden_size: 64, intermediate_size: 192, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 1024, tie_word_embeddings: true },
  'qwen3-0.6b': QWEN3_0_6B,
};

type Method = 'grpo' | 'luffy' | 'ppo' | 'ppo-shared';
type Meta = Record<string, never>;

/** Each method's options over the common ones. */
const METHODS: Record<Method, Partial<GrpoTrainerOptions<Meta>>> = {
  grpo: { estimator: 'grpo', loss: { aggregation: 'token-mean', clipHigh: 0.28 } },
  luffy: { estimator: 'dr_grpo', loss: { aggregation: 'token-sum-norm', policyTerm: 'unclipped', entropyCoef: 0.001 }, offPolicy: { traces: 1 } },
  ppo: { estimator: 'gae', loss: { aggregation: 'token-mean', clipHigh: 0.28 }, valueModel: { gamma: 1, lambda: 0.95, clip: 0.2 } },
  'ppo-shared': { estimator: 'gae', loss: { aggregation: 'token-mean', clipHigh: 0.28 }, valueModel: { trunk: 'shared', coef: 0.5, gamma: 1, lambda: 0.95, clip: 0.2 } },
};

async function main(): Promise<void> {
  const device = Device.open(arg('device', 'cuda') as 'cuda' | 'cpu');
  const compute = arg('compute', 'float32') as 'float32' | 'bfloat16';
  const shape = arg('shape', 'tiny');
  const P = Number(arg('prompts', '64'));
  const G = Number(arg('group', '8'));
  const promptLen = Number(arg('prompt-len', '64'));
  const maxNew = Number(arg('new-tokens', '512'));
  const steps = Number(arg('steps', '1'));
  const warmup = Number(arg('warmup', '1'));
  const methods = arg('methods', 'grpo,luffy,ppo,ppo-shared').split(',') as Method[];
  for (const m of methods) if (!(m in METHODS)) throw new Error(`--methods: unknown method '${m}' (${Object.keys(METHODS).join(', ')})`);
  const model = CausalLM.random(SHAPES[shape], { seed: 1, std: 0.02 });
  const V = model.config.vocabSize;
  // reward: the share of even token ids in the completion (non-uniform across a group)
  const even = combineRewards<Meta>([{ name: 'even', fn: (_p, c) => { const ids = c.split(' ').filter(Boolean).map(Number); return ids.length ? ids.filter((x) => x % 2 === 0).length / ids.length : 0; } }], { fallback: 0 });
  let seed = 7;
  const rand = () => ((seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0) / 2 ** 32);
  const token = () => 1 + Math.floor(rand() * (V - 2));
  // the same prompts (and traces, of the full length) for every method
  const batches: RlPrompt<Meta>[][] = Array.from({ length: warmup + steps }, (_, s) =>
    Array.from({ length: P }, (_x, i) => {
      const ids = Array.from({ length: promptLen }, token);
      return { ids, text: ids.join(' '), meta: {}, key: s * P + i, offPolicy: [{ tokens: Array.from({ length: maxNew }, token), stopped: false }] };
    }),
  );
  const summaries: Record<string, Record<string, number | string>> = {};
  for (const method of methods) {
    const t0 = performance.now();
    const trainer = GrpoTrainer.create<Meta>({
      model, tokenizer: { decode: (ids) => ids.join(' '), padId: 0 }, stopIds: [V - 1], rewards: even,
      groupSize: G, maxNewTokens: maxNew, minibatches: Number(arg('minibatches', '4')), microBatches: Number(arg('micro-batches', '1')),
      device, compute, attention: arg('attention', 'composed') as 'composed' | 'flash', gradientCheckpointing: flag('recompute'),
      ...METHODS[method],
    });
    const created = performance.now();
    const lines: GrpoStepMetrics[] = [];
    try {
      for (let s = 0; s < warmup + steps; s++) {
        const { metrics } = await trainer.step(batches[s], 1e-6);
        if (s < warmup) continue;
        lines.push(metrics);
        console.log(JSON.stringify({ method, step: s + 1 - warmup, ...metrics }));
      }
    } finally {
      trainer.dispose();
    }
    const mean = (k: keyof GrpoStepMetrics) => lines.reduce((a, l) => a + (l[k] as number), 0) / lines.length / 1000;
    summaries[method] = {
      method, create_s: (created - t0) / 1000, step_s: mean('step_ms'), generation_s: mean('generation_ms'), scoring_s: mean('scoring_ms'), training_s: mean('training_ms'), rewards_s: mean('rewards_ms'), host_s: mean('host_ms'),
      response_length_mean: lines.at(-1)!.response_length_mean, samples: lines.at(-1)!.samples,
      ...(method === 'luffy' ? { off_policy_share: lines.at(-1)!['off_policy/share'] } : {}),
      ...(method.startsWith('ppo') ? { value_loss: lines.at(-1)!['value/loss'] } : {}),
    };
    console.log(JSON.stringify({ summary: true, device: device.name, compute, shape, prompts: P, group: G, prompt_len: promptLen, new_tokens: maxNew, ...summaries[method], memory: device.memory() }));
  }
  const base = summaries.grpo;
  if (base) {
    const ratio = (m: string, k: string) => Number(summaries[m][k]) / Number(base[k]);
    console.log(JSON.stringify({ ratios_to_grpo: true, ...Object.fromEntries(methods.filter((m) => m !== 'grpo').flatMap((m) => ['step_s', 'scoring_s', 'training_s', 'generation_s'].map((k) => [`${m}_${k}`, ratio(m, k)]))) }));
  }
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : String(e));
  process.exit(1);
});
