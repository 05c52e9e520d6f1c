// #region header
/**
 * A custom GRPO variant, complete (docs/guides/custom-algorithm.md): a new advantage estimator and
 * a new loss term handed to GrpoTrainer, which trains the demo's tiny model on a small task.
 */
import * as L from '@lathe/onnx';
import { CausalLM } from '@lathe/models';
import { additionTokenizer, builtinBaseModel } from '@lathe/recipes';
import { aggregateLoss, combineRewards, grpoAdvantages, GrpoTrainer, policyLoss, type AdvantageFunction, type CustomObjective, type GrpoStepMetrics, type RlPrompt } from '@lathe/grpo';
// #endregion

// #region estimator
/**
 * GRPO on rewards shaped for brevity: in each group, a rewarded completion (reward > 0) gets
 * + weight·(0.5 − (len − min)/(max − min)), min and max over the group's rewarded completions;
 * unrewarded ones are left alone, so being short never pays unless the answer is right.
 */
export function conciseGrpo(weight: number): AdvantageFunction {
  return (batch) => {
    const { rewards, lengths, groupSize: G } = batch;
    const shaped = rewards.map((r, i) => {
      const start = i - (i % G);
      const rewarded = lengths.slice(start, start + G).filter((_n, k) => rewards[start + k] > 0);
      const [min, max] = [Math.min(...rewarded), Math.max(...rewarded)];
      return r > 0 && max > min ? r + weight * (0.5 - (lengths[i] - min) / (max - min)) : r;
    });
    return grpoAdvantages({ rewards: shaped, groupSize: G });
  };
}
// #endregion

// #region objective
/**
 * PPO's clipped surrogate plus β·½(log π_θ − log π_old)² per token (a proximal penalty that keeps
 * every update near the sampling policy), aggregated like the surrogate.
 */
export function proximalObjective(beta: number): CustomObjective {
  return {
    aggregation: 'token-mean',
    objective: (t) => {
      const surrogate = policyLoss(t, { aggregation: 'token-mean', clipHigh: 0.28 });
      const d = L.sub(t.logp, t.oldLogp);
      const penalty = aggregateLoss(L.mul(L.mul(d, d), 0.5), L.cast(t.mask, 'float32'), 'token-mean', t.normaliser);
      return { loss: L.add(surrogate.loss, L.mul(penalty, beta)), metrics: { ...surrogate.metrics, proximal_penalty: penalty } };
    },
  };
}
// #endregion

// #region task
/** The task: "a+b=" with a one-digit sum; a completion is right when it starts with the sum. */
const TASK = Array.from({ length: 100 }, (_, i) => [Math.floor(i / 10), i % 10])
  .filter(([a, b]) => a + b < 10)
  .map(([a, b]) => ({ question: `${a}+${b}=`, answer: String(a + b) }));
type Meta = { answer: string };
const rewards = combineRewards<Meta>([{ name: 'correct', fn: (_question, completion, meta) => (completion.startsWith(meta.answer) ? 1 : 0) }], { fallback: 0 });
// #endregion

// #region train
/** Trains for `steps` RL steps in `runDir` (the model's start and end are saved there) and returns each step's metrics. */
export async function train(runDir: string, steps: number): Promise<GrpoStepMetrics[]> {
  const model = await CausalLM.fromPretrained(builtinBaseModel(runDir, 0).dir); // any HF folder loads the same way
  const tokenizer = additionTokenizer();
  const trainer = GrpoTrainer.create<Meta>({
    model, tokenizer, stopIds: [tokenizer.eosId], rewards,
    groupSize: 8, maxNewTokens: 6, minibatches: 2,
    estimator: conciseGrpo(0.2),                 // the new estimator
    loss: proximalObjective(0.1),                // the new loss term
  });
  const history: GrpoStepMetrics[] = [];
  for (let step = 0; step < steps; step++) {
    const prompts: RlPrompt<Meta>[] = Array.from({ length: 8 }, (_, k) => {
      const key = step * 8 + k;                  // the prompt's sampling noise stream
      const { question, answer } = TASK[key % TASK.length];
      return { ids: [tokenizer.bosId, ...tokenizer.encode(question)], text: question, meta: { answer }, key };
    });
    const { metrics } = await trainer.step(prompts, 3e-3);
    console.log(`step ${step + 1}: reward ${metrics.reward_mean.toFixed(2)}, length ${metrics.response_length_mean.toFixed(2)}, proximal ${metrics['objective/proximal_penalty'].toExponential(2)}`);
    history.push(metrics);
  }
  CausalLM.fromWeights(model.config, trainer.snapshot().model).save(`${runDir}/final`);
  trainer.dispose();
  return history;
}

if (require.main === module) void train(process.argv[2] ?? 'runs/custom-algorithm', Number(process.argv[3] ?? 40));
// #endregion
