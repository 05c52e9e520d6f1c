/**
 * The browser side's files: src/web bundled by esbuild into dist/web (at `npm run build`, or here
 * on the fly when dist/web is missing or older than its sources, so a fresh clone serves as is).
 */
import { copyFileSync, existsSync, mkdirSync, readdirSync, renameSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { writeAtomic } from '@lathe/data';

/** Where the built files go. */
export const ASSETS_DIR = join(__dirname, '..', 'dist', 'web');
const WEB = join(__dirname, 'web');
const STATIC = ['index.html', 'style.css'];

function newest(dir: string): number {
  return Math.max(...readdirSync(dir).map((f) => statSync(join(dir, f)).mtimeMs));
}

/** Whether dist/web holds a build at least as new as src/web. */
export function assetsFresh(): boolean {
  const out = join(ASSETS_DIR, 'app.js');
  return existsSync(out) && statSync(out).mtimeMs >= newest(WEB) && STATIC.every((f) => existsSync(join(ASSETS_DIR, f)));
}

/** Bundles src/web/main.ts (with uPlot) and copies the static files; each file written atomically. */
export async function buildAssets(options: { minify?: boolean } = {}): Promise<string> {
  const esbuild = await import('esbuild');
  const result = await esbuild.build({
    entryPoints: [join(WEB, 'main.ts')],
    bundle: true,
    format: 'esm',
    target: 'es2022',
    minify: options.minify ?? true,
    write: false,
    outfile: join(ASSETS_DIR, 'app.js'),
    logLevel: 'silent',
  });
  mkdirSync(ASSETS_DIR, { recursive: true });
  for (const f of result.outputFiles) writeAtomic(f.path, f.text);
  const uplotCss = join(dirname(require.resolve('uplot')), 'uPlot.min.css');
  for (const [from, name] of [...STATIC.map((f) => [join(WEB, f), f]), [uplotCss, 'uPlot.min.css']]) {
    const tmp = join(ASSETS_DIR, `.${name}.${process.pid}`);
    copyFileSync(from, tmp);
    renameSync(tmp, join(ASSETS_DIR, name));
  }
  return ASSETS_DIR;
}

/** Builds the assets unless a fresh build is there. */
export async function ensureAssets(): Promise<string> {
  if (!assetsFresh()) await buildAssets();
  return ASSETS_DIR;
}
