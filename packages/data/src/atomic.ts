/** Whole-file writes that a crash cannot leave half done. */
import { renameSync, writeFileSync } from 'node:fs';

/** Writes a text file atomically (temporary file + rename): readers see the old or the new file, never a part. */
export function writeAtomic(path: string, text: string): void {
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, text);
  renameSync(tmp, path);
}
