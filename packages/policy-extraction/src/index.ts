/** @lathe/policy-extraction — the second half of ICL-V: Q-weighted sampling from π_ref·exp(Q/τ) over the reference policy's min-p candidates, and the KL distillation loss to that target. */
export * from './target';
export * from './loss';
export * from './sampler';
export * from './models';
export * from './cached';
