/**
 * `lathe serve` under load on loopback (serve-load-cases.ts), with the HTTP layer on the decode
 * loop's thread (`--http_thread false`).
 */
import { serveLoadCases } from './serve-load-cases';

serveLoadCases(false);
