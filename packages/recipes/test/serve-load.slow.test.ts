/**
 * `lathe serve` under load on loopback (serve-load-cases.ts), with the HTTP layer on its own worker
 * thread (`--http_thread true`, the default).
 */
import { serveLoadCases } from './serve-load-cases';

serveLoadCases(true);
