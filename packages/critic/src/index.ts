/** @lathe/critic — the in-context critic of ICL-V: distribution tokens over a (reward × remaining length) grid, the packed in-context format and loss, and per-candidate Q labels by tree attention. */
export * from './bins';
export * from './format';
export * from './loss';
export * from './label';
export * from './metrics';
export * from './labeller';
export * from './sessions';
