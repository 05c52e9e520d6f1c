/** Seeded test weights: Gaussian, and heavy-tailed (Student t with 3 degrees of freedom, outliers a transformer's weights have). */
import { rng } from '../../../tools/testing/ort-cpu';

export function gaussian(n: number, seed: number, std = 0.02): Float32Array {
  const u = rng(seed);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = std * Math.sqrt(-2 * Math.log(1 - u())) * Math.cos(2 * Math.PI * u());
  return out;
}

export function heavyTailed(n: number, seed: number, std = 0.02): Float32Array {
  const z = gaussian(4 * n, seed, 1);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = (std * z[4 * i]) / Math.sqrt((z[4 * i + 1] ** 2 + z[4 * i + 2] ** 2 + z[4 * i + 3] ** 2) / 3);
  return out;
}
