/** Reading files through a descriptor, with errors that name the file. */
import { closeSync, openSync, readSync } from 'node:fs';

/** Runs `read` on the file opened for reading, closing it afterwards; an unopenable file is an error naming it. */
export function withOpenFile<T>(file: string, read: (fd: number) => T): T {
  let fd: number;
  try {
    fd = openSync(file, 'r');
  } catch (e) {
    throw new Error(`${file}: cannot open (${(e as NodeJS.ErrnoException).code ?? String(e)})`);
  }
  try {
    return read(fd);
  } finally {
    closeSync(fd);
  }
}

/** The first `n` bytes of a file (fewer if it is shorter); an unopenable file is an error naming it. */
export function leadingBytes(file: string, n: number): Buffer {
  return withOpenFile(file, (fd) => {
    const b = Buffer.alloc(n);
    return b.subarray(0, readSync(fd, b, 0, n, 0));
  });
}
