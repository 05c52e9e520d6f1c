/** `npm run build` of @lathe/studio: bundles the browser side into dist/web. */
import { buildAssets } from './assets';

buildAssets().then(
  (dir) => console.log(`studio: assets built in ${dir}`),
  (e: Error) => {
    console.error(`studio: build failed: ${e.message}`);
    process.exitCode = 1;
  },
);
