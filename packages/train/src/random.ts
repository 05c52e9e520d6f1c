/** @deprecated The seeded RNG's home is @lathe/models (random.ts): import `seededRandom` and `permutation` from there. */
export { permutation, seededRandom } from '@lathe/models';
