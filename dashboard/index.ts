// The dashboard's static files, served by `prima-coord serve` on the API's port. The page itself is
// plain HTML, CSS and ES modules in this folder (no build step); this module only finds them (from the
// sources or from dist/) and answers GET / and the asset paths with strict headers.
import { existsSync, readdirSync, readFileSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { extname, join } from "node:path";
import { packageRoot } from "../base/index.js";

const CONTENT_TYPES: Readonly<Record<string, string>> = {
  ".html": "text/html; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
};

/** Headers on every asset: nothing but our own files may load, run or frame the page. */
export const DASHBOARD_SECURITY_HEADERS: Readonly<Record<string, string>> = {
  "Content-Security-Policy": "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; object-src 'none'",
  "X-Content-Type-Options": "nosniff",
  "X-Frame-Options": "DENY",
  "Referrer-Policy": "no-referrer",
  // A new version of the package must show at once, not after a browser's heuristic expiry.
  "Cache-Control": "no-cache",
};

/** The folder holding index.html and its assets, in the package root whether this runs from the
 * sources (tests) or from dist/ (installed). */
export function dashboardAssetsDir(): string {
  const dir = join(packageRoot(), "dashboard");
  if (!existsSync(join(dir, "index.html"))) throw new Error(`dashboard: no index.html in ${dir}`);
  return dir;
}

interface Asset { readonly body: Buffer; readonly type: string }
let assets: Map<string, Asset> | undefined;

/**
 * The URL path of every asset, read once. Only the files in the folder with a known type are served,
 * so a request path is a key in this map and never reaches the file system (no traversal to handle).
 */
function loadAssets(): Map<string, Asset> {
  if (assets) return assets;
  const dir = dashboardAssetsDir();
  const map = new Map<string, Asset>();
  for (const name of readdirSync(dir)) {
    const type = CONTENT_TYPES[extname(name)];
    if (!type) continue;
    map.set(`/${name}`, { body: readFileSync(join(dir, name)), type });
  }
  const index = map.get("/index.html");
  if (index) map.set("/", index);
  return (assets = map);
}

/** The URL paths the dashboard answers (for serve's route list and tests). */
export function dashboardPaths(): string[] {
  return [...loadAssets().keys()];
}

/**
 * Answers GET or HEAD of `/` and the dashboard's assets; returns false (writing nothing) for any other
 * request, so the caller goes on to its own routes and its 404.
 */
export function serveDashboardAsset(req: IncomingMessage, res: ServerResponse): boolean {
  if (req.method !== "GET" && req.method !== "HEAD") return false;
  const url = req.url ?? "/";
  const q = url.search(/[?#]/);
  const asset = loadAssets().get(q < 0 ? url : url.slice(0, q));
  if (!asset) return false;
  res.writeHead(200, { ...DASHBOARD_SECURITY_HEADERS, "Content-Type": asset.type, "Content-Length": asset.body.length });
  res.end(req.method === "HEAD" ? undefined : asset.body);
  return true;
}
