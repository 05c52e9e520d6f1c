/**
 * Policy extraction learns (CPU, the built-in tiny Qwen3 and character tokenizer), on the critic's
 * kind of synthetic task: copy a prompt's three digits, where the policy first picks a careful mode
 * ('+', then each digit copied with 5 % error) or a sloppy one ('=', 60 % error); reward 1 when the
 * copy is exact. π_ref is the built-in model fine-tuned on that policy's samples (lathe extract rft
 * with a success threshold of 0: plain SFT), the critic is trained from π_ref on the same samples
 * (lathe critic train), and on held-out prompts at equal n:
 * - Q-weighted sampling (τ 0.1) beats π_ref's own sampling;
 * - the KL-distilled policy (lathe extract train on π_ref's samples labelled with the critic's Q)
 *   beats π_ref with no critic at inference; without the candidate-mass term (the KL alone, which
 *   sees π_θ renormalised over the candidates) mass drifts onto other tokens, reported beside it;
 * - RFT (lathe extract rft on the successful samples) is reported beside them;
 * - the critic's best-of-n and majority vote at n = 4 are reported.
 * The printed table is the one in packages/policy-extraction/README.md.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CausalLM, seededRandom } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { loadBins } from '@lathe/critic';
import { writeTrajectories, type Trajectory } from '@lathe/data';
import { qWeightedSample, QWeightedModels, type QSample } from '@lathe/policy-extraction';
import { additionTokenizer } from '../src/demo-task';
import { defaults } from '../src/options';
import { criticTrainSchema } from '../src/critic-config';
import { runCriticTrain } from '../src/critic';
import { extractRftSchema, extractTrainSchema } from '../src/extract-config';
import { evaluationTable, finalQ, runExtractRft, runExtractTrain } from '../src/extract';

const tok = additionTokenizer();
const enc = (s: string) => tok.encode(s);
const DIGITS = 3;

/** A sample of the synthetic policy for prompt digits `d`. */
function synthetic(d: string, next: () => number): number[] {
  const careful = next() < 0.5;
  const err = careful ? 0.05 : 0.6;
  const copy = [...d].map((c) => (next() < err ? String((Number(c) + 1 + Math.floor(next() * 9)) % 10) : c)).join('');
  return [...enc((careful ? '+' : '=') + copy), tok.eosId];
}

/** 1 when the output is a mode token, the prompt's digits exactly, then EOS. */
const reward = (digits: string, out: readonly number[]) => (out.length === DIGITS + 2 && out[DIGITS + 1] === tok.eosId && tok.decode(out.slice(1, DIGITS + 1)) === digits ? 1 : 0);
/** The answer a sample votes for: its digits. */
const answerOf = (out: readonly number[]) => tok.decode(out.slice(1).filter((t) => t !== tok.eosId)) || null;

function prompts(n: number, seed: number): string[] {
  const next = seededRandom(seed);
  return Array.from({ length: n }, () => Array.from({ length: DIGITS }, () => String(Math.floor(next() * 10))).join(''));
}

test('Q-weighted sampling and the KL-distilled policy beat π_ref; RFT, best-of-n and majority vote beside them', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'extract-learn-'));
  const next = seededRandom(1);
  const trainPrompts = prompts(300, 2);
  const rows: Trajectory[] = trainPrompts.flatMap((d, p) => Array.from({ length: 4 }, () => synthetic(d, next)).map((out) => ({ prompt_idx: p, prompt: `${d}=`, prompt_token_ids: enc(`${d}=`), output_token_ids: out, correct: reward(d, out) })));
  const data = join(dir, 'synthetic.parquet');
  await writeTrajectories(data, rows);
  const train = { tokenizer: 'builtin:addition', batch_size: 16, save_every: 0, log_every: 1000, warmup_steps: 10, weight_decay: 0 };

  // π_ref: the built-in model fine-tuned on every sample (threshold 0: plain SFT)
  const ref = await runExtractRft({ ...defaults(extractRftSchema), ...train, data, model: 'builtin:tiny', run_dir: join(dir, 'ref'), success_threshold: 0, steps: 200, lr: 3e-3 });
  // the critic, from π_ref, on the same samples
  const criticRun = await runCriticTrain({ ...defaults(criticTrainSchema), ...train, data, model: ref.checkpoint, run_dir: join(dir, 'critic'), ablation: 'no_context', max_length: 16, max_remaining: 8, length_bins: 4, batch_size: 16, steps: 200, lr: 3e-3 });

  const device = Device.open('cpu');
  const bins = loadBins(criticRun.checkpoint);
  const criticLm = CausalLM.fromPretrainedSync(criticRun.checkpoint);
  const open = (policy: string) => {
    const lm = CausalLM.fromPretrainedSync(policy);
    return QWeightedModels.open({ device, reference: { name: policy, config: lm.config, weights: lm.float32Weights() }, critic: { name: criticRun.checkpoint, config: criticLm.config, weights: criticLm.float32Weights() }, bins, minP: 0.02, maxCandidates: 8, padId: tok.padId });
  };
  const N = 4;
  const held = prompts(60, 99);
  const requests = held.flatMap((d, p) => Array.from({ length: N }, (_, j) => ({ prompt: enc(`${d}=`), key: p * N + j })));
  const sample = (models: QWeightedModels, tau: number) => qWeightedSample(requests, models, { tau, score: Number.isFinite(tau), maxTokens: DIGITS + 2, seed: 7, stopIds: [tok.eosId] });
  const accuracy = (samples: readonly QSample[]) => samples.reduce((s, x, i) => s + reward(held[Math.floor(i / N)], x.output), 0) / samples.length;

  const refModels = open(ref.checkpoint);
  const refSamples = await sample(refModels, Infinity);
  const qSamples = await sample(refModels, 0.1);
  // best-of-n and majority vote over π_ref's samples, the critic scoring each after its last token
  const scores = await finalQ(refModels, requests.map((r) => r.prompt), refSamples, 64);
  const table = evaluationTable(
    held.map((d, p) => refSamples.slice(p * N, p * N + N).map((s, j) => ({ correct: reward(d, s.output) === 1, score: scores[p * N + j], answer: answerOf(s.output) }))),
    [1, N],
  );

  // labelled π_ref samples on the training prompts → KL distillation; their successful ones → RFT
  const labelRequests = trainPrompts.slice(0, 150).flatMap((d, p) => Array.from({ length: 4 }, (_, j) => ({ prompt: enc(`${d}=`), key: 10_000 + p * 4 + j })));
  const labelled = await qWeightedSample(labelRequests, refModels, { tau: Infinity, maxTokens: DIGITS + 2, seed: 11, stopIds: [tok.eosId] });
  refModels.dispose();
  const labelledRows: Trajectory[] = labelled.map((s, i) => ({
    prompt_idx: Math.floor(i / 4),
    prompt: '',
    prompt_token_ids: labelRequests[i].prompt,
    output_token_ids: s.output,
    correct: reward(trainPrompts[Math.floor(i / 4)], s.output),
    candidate_ids: s.candidate_ids,
    candidate_q_values: s.candidate_q_values,
    candidate_ref_logprobs: s.candidate_ref_logprobs,
  }));
  const labelledFile = join(dir, 'labelled.parquet');
  await writeTrajectories(labelledFile, labelledRows);
  const kl = await runExtractTrain({ ...defaults(extractTrainSchema), ...train, data: labelledFile, model: ref.checkpoint, run_dir: join(dir, 'kl'), tau: 0.1, steps: 80, lr: 2e-3 });
  // the KL alone (no candidate-mass term): mass drifts onto tokens outside the candidates
  const klAlone = await runExtractTrain({ ...defaults(extractTrainSchema), ...train, data: labelledFile, model: ref.checkpoint, run_dir: join(dir, 'kl-alone'), tau: 0.1, steps: 80, lr: 2e-3, candidate_mass: 0 });
  const rft = await runExtractRft({ ...defaults(extractRftSchema), ...train, data: labelledFile, model: ref.checkpoint, run_dir: join(dir, 'rft'), success_threshold: 1, steps: 80, lr: 2e-3 });

  const alone = async (policy: string) => {
    const models = open(policy);
    try {
      const out = await sample(models, Infinity);
      // malformed: not a mode token, three tokens and EOS
      return { accuracy: accuracy(out), malformed: out.filter((s) => s.output.length !== DIGITS + 2 || s.output[DIGITS + 1] !== tok.eosId).length / out.length };
    } finally {
      models.dispose();
    }
  };
  const [klRun, klAloneRun, rftRun] = [await alone(kl.checkpoint), await alone(klAlone.checkpoint), await alone(rft.checkpoint)];
  const numbers = {
    ref: accuracy(refSamples),
    q_weighted: accuracy(qSamples),
    kl_distilled: klRun.accuracy,
    kl_distilled_malformed: klRun.malformed,
    kl_alone: klAloneRun.accuracy,
    kl_alone_malformed: klAloneRun.malformed,
    rft: rftRun.accuracy,
    ref_single_at_4: table[1].single,
    critic_best_of_4: table[1].critic_best_of_n,
    majority_of_4: table[1].majority_vote,
    pass_at_4: table[1].pass_at_n,
    labelled_success: labelledRows.reduce((s, r) => s + r.correct!, 0) / labelledRows.length,
  };
  console.log(JSON.stringify(numbers));
  expect(numbers.q_weighted).toBeGreaterThan(numbers.ref + 0.15);
  expect(numbers.kl_distilled).toBeGreaterThan(numbers.ref + 0.1);
  expect(numbers.critic_best_of_4).toBeGreaterThan(numbers.ref_single_at_4);
}, 180_000);
