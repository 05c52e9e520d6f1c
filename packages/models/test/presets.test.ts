/**
 * The presets' shapes against Qwen3's published sizes, computed from the configs alone (no weights
 * are allocated): every preset parses, and the real shapes have their models' parameter counts.
 */
import { MODEL_PRESET_NAMES, MODEL_PRESETS, paramSpecs, parseConfig, type HfConfig } from '@lathe/models';

const parameters = (name: keyof typeof MODEL_PRESETS) => paramSpecs(parseConfig(MODEL_PRESETS[name].config as HfConfig)).reduce((n, s) => n + s.shape.reduce((a, b) => a * b, 1), 0);

test.each([
  // Qwen3's model cards: 0.6B, 1.7B, 4.0B, 8.2B, 14.8B (the exact counts of the config.json shapes)
  ['qwen3-0.6b', 596_049_920],
  ['qwen3-1.7b', 1_720_574_976],
  ['qwen3-4b', 4_022_468_096],
  ['qwen3-8b', 8_190_735_360],
  ['qwen3-14b', 14_768_307_200],
] as const)('%s has %d parameters', (name, count) => {
  expect(parameters(name)).toBe(count);
});

test('Qwen3-4B and -8B are within 1 % of the published 4.02B and 8.19B', () => {
  expect(Math.abs(parameters('qwen3-4b') / 4.02e9 - 1)).toBeLessThan(0.01);
  expect(Math.abs(parameters('qwen3-8b') / 8.19e9 - 1)).toBeLessThan(0.01);
  expect(Math.abs(parameters('qwen3-14b') / 14.8e9 - 1)).toBeLessThan(0.01);
});

test('Qwen3-8B has its own LM head; the smaller shapes tie it to the embedding', () => {
  const names = (p: keyof typeof MODEL_PRESETS) => paramSpecs(parseConfig(MODEL_PRESETS[p].config as HfConfig)).map((s) => s.name);
  expect(names('qwen3-8b')).toContain('lm_head.weight');
  expect(names('qwen3-14b')).toContain('lm_head.weight');
  const c14 = parseConfig(MODEL_PRESETS['qwen3-14b'].config as HfConfig);
  expect([c14.hiddenSize, c14.intermediateSize, c14.numLayers, c14.numHeads, c14.numKvHeads, c14.headDim]).toEqual([5120, 17408, 40, 40, 8, 128]);
  for (const p of ['qwen3-0.6b', 'qwen3-1.7b', 'qwen3-4b'] as const) expect(names(p)).not.toContain('lm_head.weight');
  const c8 = parseConfig(MODEL_PRESETS['qwen3-8b'].config as HfConfig);
  expect([c8.hiddenSize, c8.intermediateSize, c8.numLayers, c8.numHeads, c8.numKvHeads, c8.headDim, c8.maxPositionEmbeddings]).toEqual([4096, 12288, 36, 32, 8, 128, 40960]);
  const c4 = parseConfig(MODEL_PRESETS['qwen3-4b'].config as HfConfig);
  expect([c4.hiddenSize, c4.intermediateSize, c4.numLayers, c4.numHeads, c4.numKvHeads, c4.headDim, c4.maxPositionEmbeddings]).toEqual([2560, 9728, 36, 32, 8, 128, 40960]);
});

test('each real shape says its parameters and bfloat16 size in its help line', () => {
  for (const name of MODEL_PRESET_NAMES.filter((n) => n !== 'tiny-qwen3')) {
    const p = parameters(name);
    const { describe } = MODEL_PRESETS[name];
    expect(describe).toMatch(/parameters/);
    // the size in GB to one decimal, as 2 bytes a parameter
    expect(describe).toContain(`${((2 * p) / 1e9).toFixed(1)} GB in bfloat16`);
  }
});
