/**
 * The labeller on tiny random Qwen3s (CPU): the reference policy's min-p candidates and entropies
 * equal those of its full softmax computed on the host, and each candidate's Q and remaining length
 * equal the critic's marginals for prefix + candidate run alone.
 */
import { Device } from '@lathe/runtime';
import * as L from '@lathe/onnx';
import { CausalLM, MODEL_PRESETS, parseConfig, type HfConfig } from '@lathe/models';
import { CriticLabeller, marginals, minPCandidates, referenceCandidatesGraph, type CriticBins } from '@lathe/critic';
import { logitsRunner, tinyModel, tinyQwen3 } from '../../models/test/tiny';

const bins: CriticBins = { reward_values: [0, 1], length_edges: [0, 1, 2, 4, 8], first_token_id: 56 };
const critic = tinyModel(tinyQwen3, 3);
const reference = tinyModel({ ...tinyQwen3, vocab_size: 56 }, 4);

const softmax = (z: number[]) => {
  const m = Math.max(...z);
  const e = z.map((v) => Math.exp(v - m));
  const s = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / s);
};

test('min-p filter of sorted log-probs', () => {
  const lp = [Math.log(0.5), Math.log(0.2), Math.log(0.05), Math.log(0.049)];
  expect(minPCandidates([7, 3, 9, 1], lp, 0.1)).toEqual({ ids: [7, 3, 9], logprobs: lp.slice(0, 3) });
});

test('labels: min-p candidates of the reference, Q and remaining length of each by the critic', async () => {
  const device = Device.open('cpu');
  const labeller = CriticLabeller.open({
    device,
    critic: { config: critic.config, weights: CausalLM.fromPretrainedSync(critic.dir).float32Weights() },
    reference: { config: reference.config, weights: CausalLM.fromPretrainedSync(reference.dir).float32Weights() },
    bins,
    minP: 0.3,
    maxCandidates: 8,
    padId: 0,
  });
  try {
    const inputs = [
      { prompt: [5, 6], criticPrefix: [5, 6], output: [7, 8, 9] },
      { prompt: [10], criticPrefix: [10, 11, 12], output: [13, 14] },
    ];
    const labels = await labeller.label(inputs);
    const refRun = await logitsRunner(reference.dir, reference.config, 'padding');
    const criticRun = await logitsRunner(critic.dir, critic.config, 'padding');
    const cellsAt = async (ids: number[]) => {
      const logits = (await criticRun({ input_ids: [ids], attention_mask: [ids.map(() => 1)] })).data as Float32Array;
      const V = critic.config.vocabSize;
      const t = ids.length - 1;
      return softmax(Array.from({ length: 8 }, (_, c) => logits[t * V + 56 + c]));
    };
    for (const [b, x] of inputs.entries()) {
      const seq = [...x.prompt, ...x.output];
      const logits = (await refRun({ input_ids: [seq], attention_mask: [seq.map(() => 1)] })).data as Float32Array;
      for (let t = 0; t < x.output.length; t++) {
        const p = softmax(Array.from(logits.slice((x.prompt.length + t - 1) * 56, (x.prompt.length + t) * 56)));
        const pmax = Math.max(...p);
        const want = p.map((v, id) => ({ v, id })).filter((e) => e.v >= 0.3 * pmax).sort((a, c) => c.v - a.v);
        expect(labels[b].candidate_ids[t]).toEqual(want.slice(0, 8).map((e) => e.id));
        labels[b].candidate_ref_logprobs[t].forEach((lp, j) => expect(lp).toBeCloseTo(Math.log(want[j].v), 4));
        for (const [j, id] of labels[b].candidate_ids[t].entries()) {
          const m = marginals(bins, await cellsAt([...x.criticPrefix, ...x.output.slice(0, t), id]));
          expect(labels[b].candidate_q_values[t][j]).toBeCloseTo(m.q, 4);
          expect(labels[b].candidate_remaining[t][j]).toBeCloseTo(m.remaining, 4);
        }
        // the reference's entropy at the position predicting the token: −Σ p log p of its full softmax
        expect(labels[b].token_entropies[t]).toBeCloseTo(-p.reduce((a, v) => a + (v > 0 ? v * Math.log(v) : 0), 0), 4);
        const realised = marginals(bins, await cellsAt([...x.criticPrefix, ...x.output.slice(0, t + 1)]));
        expect(labels[b].token_q_values[t]).toBeCloseTo(realised.q, 4);
      }
    }
  } finally {
    labeller.dispose();
  }
});

test("the reference pass places no node on the CPU under ONNX Runtime's CUDA rule (Qwen3-0.6B's shape, bfloat16), so it runs with CPU fallback off", () => {
  const config = parseConfig(MODEL_PRESETS['qwen3-0.6b'].config as HfConfig);
  expect(L.describeCpuPlacement(L.cpuPlacedNodes(L.toModelProto(referenceCandidatesGraph(config, 'bfloat16', 4))))).toBe('');
});
