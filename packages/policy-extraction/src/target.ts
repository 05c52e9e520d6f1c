/**
 * The extraction target over one position's candidate set: π*(a) ∝ π_ref(a)·exp(Q(a)/τ), restricted
 * to the reference policy's min-p candidates. Host-side (float64) so the sampler and the tests share
 * one definition with the loss graph.
 */

/** Checks a temperature: a positive number, or Infinity (π* = π_ref renormalised over the candidates). */
export function validateTau(tau: number, where = 'tau'): number {
  if (typeof tau !== 'number' || Number.isNaN(tau) || !(tau > 0)) throw new Error(`${where} must be > 0 (the temperature of π_ref·exp(Q/τ)), got ${tau}`);
  return tau;
}

/**
 * log π* over the candidates: log-softmax of refLogprobs + Q/τ (τ = Infinity drops Q). The result is
 * normalised over the candidates, whatever mass π_ref puts elsewhere.
 */
export function targetLogprobs(refLogprobs: readonly number[], q: readonly number[], tau: number): number[] {
  if (refLogprobs.length !== q.length) throw new Error(`targetLogprobs: ${refLogprobs.length} reference log-probs for ${q.length} Q values`);
  if (refLogprobs.length === 0) return [];
  const z = refLogprobs.map((lp, i) => lp + (Number.isFinite(tau) ? q[i] / tau : 0));
  const m = Math.max(...z);
  const lse = m + Math.log(z.reduce((s, v) => s + Math.exp(v - m), 0));
  return z.map((v) => v - lse);
}

/** π* over the candidates (probabilities summing to 1). */
export function targetProbs(refLogprobs: readonly number[], q: readonly number[], tau: number): number[] {
  return targetLogprobs(refLogprobs, q, tau).map(Math.exp);
}

/** Index drawn from `probs` (summing to 1) by a uniform `u` in [0, 1): the first whose cumulative sum exceeds u. */
export function drawIndex(probs: readonly number[], u: number): number {
  let acc = 0;
  for (let i = 0; i < probs.length; i++) {
    acc += probs[i];
    if (u < acc) return i;
  }
  return probs.length - 1;
}

/** KL(p‖q) = Σ p (log p − log q) over log-probs of one candidate set (0·log 0 = 0). */
export function klDivergence(logp: readonly number[], logq: readonly number[]): number {
  return logp.reduce((s, lp, i) => (lp === -Infinity ? s : s + Math.exp(lp) * (lp - logq[i])), 0);
}
