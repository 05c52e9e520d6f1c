/**
 * The one seeded RNG: its sequences are pinned to the values the generators it replaced gave
 * (random-model.ts' normal sampler, sft-data.ts' mulberry32 and permutation), so random weights,
 * LoRA's initial adapters and data orders are unchanged by the move.
 */
import { permutation, seededNormal, seededRandom, seededShuffle } from '@lathe/models';

test('seededRandom is mulberry32: the same first values as before the move', () => {
  const u = seededRandom(0);
  expect([u(), u(), u()]).toEqual([0.26642920868471265, 0.0003297457005828619, 0.2232720274478197]);
  const v = seededRandom(42);
  expect([v(), v()]).toEqual([0.6011037519201636, 0.44829055899754167]);
});

test('seededNormal is Box-Muller over seededRandom: the same first values as random-model.ts gave', () => {
  const n = seededNormal(1);
  expect([n(), n(), n()]).toEqual([1.4043387784152637, 1.2157546192705377, -0.5103768768108126]);
});

test('permutation and seededShuffle: the same orders as before, a permutation, a function of the seed', () => {
  expect(permutation(8, 3)).toEqual([7, 4, 1, 3, 6, 2, 0, 5]);
  expect(permutation(5, 0)).toEqual([4, 2, 3, 0, 1]);
  const items = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'];
  expect(seededShuffle(items, 3)).toEqual(permutation(8, 3).map((i) => items[i]));
  expect(items).toEqual(['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']); // a copy, not in place
  const p = permutation(100, 9);
  expect([...p].sort((a, b) => a - b)).toEqual([...Array(100).keys()]);
  expect(permutation(100, 9)).toEqual(p);
  expect(permutation(100, 10)).not.toEqual(p);
});
