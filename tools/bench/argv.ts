/**
 * Command-line reading shared by the benchmark scripts (bundled for the GPU machine, where they
 * take a handful of `--name value` options and `--flag` switches).
 */

/** The value after `--name`, else `fallback`; without a fallback a missing option is an error. */
export function arg(name: string, fallback?: string): string {
  const i = process.argv.indexOf(`--${name}`);
  if (i >= 0 && process.argv[i + 1] !== undefined) return process.argv[i + 1];
  if (fallback !== undefined) return fallback;
  throw new Error(`missing --${name}`);
}

/** Whether the switch `--name` is present. */
export function flag(name: string): boolean {
  return process.argv.includes(`--${name}`);
}
