/**
 * The critic's synthetic task for critic-learning.test.ts and critic-learning.slow.test.ts: a
 * policy that picks a careful mode (first token '+', a chain of '+' of random length, then for each
 * digit '=', the sum's digit and the answer's digit, copied with 5 % error) or a sloppy one (no
 * chain, first token '=', the answer's digits copied with 60 % error); reward 1 when the answer
 * equals the sum. The outcome is predictable from the first token and exactly from the answer's
 * digits, and the length from the mode and the position.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as L from '@lathe/onnx';
import { CausalLM, paramSpecs, seededRandom, weightInputs } from '@lathe/models';
import { writeTrajectories, type Trajectory } from '@lathe/data';
import { auc, criticTreeProbs, expectedCalibrationError, loadBins, meanAbsoluteError, padTreeBatch, treeEstimates, treeRow } from '@lathe/critic';
import { additionTokenizer } from '../src/demo-task';
import { defaults } from '../src/options';
import { criticTrainSchema } from '../src/critic-config';
import { runCriticTrain } from '../src/critic';
import { compile } from '../../../tools/testing/ort-cpu';

const tok = additionTokenizer();
const enc = (s: string) => tok.encode(s);

interface Sample {
  prompt: number[];
  attempt: number[];
  reward: number;
  /** Index in `attempt` of each answer digit, with the right digit's id there. */
  answer: { at: number; right: number }[];
}

/** One attempt of the synthetic policy at a + b. */
function sample(a: number, b: number, next: () => number): Sample {
  const sum = String(a + b);
  const careful = next() < 0.5;
  const head = careful ? '+'.repeat(1 + Math.floor(next() * 8)) : '';
  const err = careful ? 0.05 : 0.6;
  const answer = [...sum].map((d) => (next() < err ? String((Number(d) + 1 + Math.floor(next() * 9)) % 10) : d)).join('');
  // '=', a digit of the sum (the chain of thought), the answer's digit there; for each digit
  const text = head + [...sum].map((d, k) => '=' + d + answer[k]).join('');
  const attempt = [...enc(text), tok.eosId];
  return { prompt: enc(`${a}+${b}=`), attempt, reward: answer === sum ? 1 : 0, answer: [...sum].map((d, k) => ({ at: head.length + 3 * k + 2, right: enc(d)[0] })) };
}

function dataset(prompts: number, perPrompt: number, seed: number): Sample[][] {
  const next = seededRandom(seed);
  return Array.from({ length: prompts }, () => {
    const a = Math.floor(next() * 100);
    const b = Math.floor(next() * 100);
    return Array.from({ length: perPrompt }, () => sample(a, b, next));
  });
}

/** What {@link trainAndMeasure} measures on 240 held-out attempts. */
export interface CriticMeasures {
  /** AUC of the first token's Q against the outcome. */
  auc: number;
  /** Expected calibration error of the first token's Q (10 bins). */
  ece: number;
  /** Mean absolute error of the expected remaining length, and of predicting the training mean. */
  lengthMae: number;
  naiveMae: number;
  /** Share of answer positions where Q(right digit) > Q(a wrong digit), over `compared` positions. */
  rightAboveWrong: number;
  compared: number;
}

/** Trains the built-in tiny model as a critic on `prompts` × 4 attempts for `steps` steps at peak `lr`, then measures it on held-out prompts. */
export async function trainAndMeasure(o: { prompts: number; steps: number; lr: number }): Promise<CriticMeasures> {
  const dir = mkdtempSync(join(tmpdir(), 'critic-learn-'));
  const train = dataset(o.prompts, 4, 1);
  const rows: Trajectory[] = train.flatMap((group, p) => group.map((s) => ({ prompt_idx: p, prompt: '', prompt_token_ids: s.prompt, output_token_ids: s.attempt, correct: s.reward })));
  await writeTrajectories(join(dir, 'train.parquet'), rows);
  const result = await runCriticTrain({
    ...defaults(criticTrainSchema),
    data: join(dir, 'train.parquet'),
    tokenizer: 'builtin:addition',
    run_dir: join(dir, 'run'),
    ablation: 'no_context',
    max_length: 64,
    max_remaining: 24,
    length_bins: 6,
    batch_size: 8,
    steps: o.steps,
    lr: o.lr,
    warmup_steps: 10,
    weight_decay: 0,
    save_every: 0,
    log_every: 50,
  });
  if (result.steps !== o.steps) throw new Error(`trained ${result.steps} of ${o.steps} steps`);

  // Held-out prompts through the tree pass: first-token Q and remaining lengths of every attempt,
  // and at each answer digit whose answer so far is right, the right digit and a wrong one.
  const bins = loadBins(result.checkpoint);
  const lm = CausalLM.fromPretrainedSync(result.checkpoint);
  const g = new L.Graph('critic_label');
  const { weights } = weightInputs(g, lm.config, 'float32', 'float32');
  g.output(criticTreeProbs(g, lm.config, bins, weights), 'cell_probs');
  const run = await compile(g);
  const w = lm.float32Weights();
  const feeds = Object.fromEntries(paramSpecs(lm.config).map((s) => [s.name, { data: w.get(s.name)!, dims: s.shape }]));
  const held = dataset(60, 4, 99).flat();
  const next = seededRandom(7);
  const firstQ: number[] = [];
  const outcomes: number[] = [];
  const predictedLength: number[] = [];
  const trueLength: number[] = [];
  let ordered = 0;
  let compared = 0;
  for (let i = 0; i < held.length; i += 16) {
    const chunk = held.slice(i, i + 16);
    const trees = chunk.map((s) => {
      const candidates = s.attempt.map(() => [] as number[]);
      let rightSoFar = true;
      for (const { at, right } of s.answer) {
        if (rightSoFar) candidates[at] = [right, enc(String((right - 3 + 1 + Math.floor(next() * 9)) % 10))[0]];
        rightSoFar &&= s.attempt[at] === right;
      }
      return treeRow(s.prompt, s.attempt, candidates);
    });
    const out = await run({ ...feeds, ...padTreeBatch(trees, tok.padId) });
    trees.forEach((tree, b) => {
      const est = treeEstimates(bins, out.cell_probs.data as Float32Array, out.cell_probs.dims, tree, b);
      const s = chunk[b];
      firstQ.push(est.realised[0].q);
      outcomes.push(s.reward);
      est.realised.forEach((e, t) => {
        predictedLength.push(e.remaining);
        trueLength.push(s.attempt.length - 1 - t);
      });
      for (const cands of est.candidates) {
        if (cands.length !== 2) continue;
        compared++;
        if (cands[0].q > cands[1].q) ordered++;
      }
    });
  }
  // the naive baseline: every token's remaining length predicted as the training tokens' mean
  const lengths = rows.map((r) => r.output_token_ids.length);
  const meanTrain = lengths.reduce((s, T) => s + (T * (T - 1)) / 2, 0) / lengths.reduce((s, T) => s + T, 0);
  const naive = meanAbsoluteError(trueLength.map(() => meanTrain), trueLength);
  return { auc: auc(firstQ, outcomes), ece: expectedCalibrationError(firstQ, outcomes), lengthMae: meanAbsoluteError(predictedLength, trueLength), naiveMae: naive, rightAboveWrong: ordered / compared, compared };
}
