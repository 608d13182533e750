// Validates Grafana dashboard JSON files against Grafana's dashboard JSON schema.
//
//   node scripts/check-dashboard-schema.mjs TOOLS_DIR dashboards/*.json
//
// TOOLS_DIR is where scripts/install-tools.sh installed ajv and generated
// dashboard.schema.json from @grafana/schema's TypeScript types (Grafana ships no JSON
// Schema). Prints one JSON object per file, {"file", "errors": [{"path", "message"}]}, and
// exits 1 when any file has an error, 2 when the tools are missing.
import { createRequire } from "node:module";
import { readFileSync, existsSync } from "node:fs";
import { join, resolve } from "node:path";

const [toolsDir, ...files] = process.argv.slice(2);
if (!toolsDir || files.length === 0) {
  console.error("usage: check-dashboard-schema.mjs TOOLS_DIR FILE.json...");
  process.exit(2);
}
const schemaPath = join(toolsDir, "dashboard.schema.json");
if (!existsSync(schemaPath)) {
  console.error(`${schemaPath} is missing: run scripts/install-tools.sh`);
  process.exit(2);
}
const require = createRequire(join(resolve(toolsDir), "package.json"));
const Ajv = require("ajv");
const ajv = new Ajv({ allErrors: true, strict: false });
const validate = ajv.compile(JSON.parse(readFileSync(schemaPath, "utf8")));

let failed = false;
for (const file of files) {
  let errors = [];
  try {
    if (!validate(JSON.parse(readFileSync(file, "utf8")))) {
      errors = validate.errors.map((e) => ({
        path: e.instancePath || "/",
        message: `${e.message}${e.params && e.params.additionalProperty ? ` (${e.params.additionalProperty})` : ""}`,
      }));
    }
  } catch (e) {
    errors = [{ path: "/", message: `cannot read: ${e.message}` }];
  }
  failed ||= errors.length > 0;
  console.log(JSON.stringify({ file, errors }));
}
// exitCode, not exit(): exit() would cut off output still buffered for a pipe.
process.exitCode = failed ? 1 : 0;
