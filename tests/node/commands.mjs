// An executor's signature check written from the README alone, in another language:
// RFC 8785 canonical JSON of the command as received minus its signature, HMAC-SHA256.
// stdin: {"keys": {"<key id>": "<key>"}, "verify": ["<wire>", ...],
//         "sign": {"key_id": "<key id>", "wire": "<unsigned command>"}}
// stdout: {"verified": [true|false, ...], "signed": "<wire>"}
import { createHmac, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";

function canonical(value) {
  if (Array.isArray(value)) return "[" + value.map(canonical).join(",") + "]";
  if (value !== null && typeof value === "object") {
    return "{" + Object.keys(value).sort()
      .map((k) => JSON.stringify(k) + ":" + canonical(value[k])).join(",") + "}";
  }
  return JSON.stringify(value);
}

function digest(key, command) {
  const { signature, ...rest } = command;
  return createHmac("sha256", Buffer.from(key, "utf8"))
    .update(Buffer.from(canonical(rest), "utf8")).digest("hex");
}

function verify(keys, wire) {
  const command = JSON.parse(wire);
  const key = keys[command.key_id];
  if (key === undefined || typeof command.signature !== "string") return false;
  const expected = Buffer.from(digest(key, command), "utf8");
  const given = Buffer.from(command.signature, "utf8");
  return expected.length === given.length && timingSafeEqual(expected, given);
}

const input = JSON.parse(readFileSync(0, "utf8"));
const out = { verified: input.verify.map((wire) => verify(input.keys, wire)) };
if (input.sign) {
  const command = JSON.parse(input.sign.wire);
  command.key_id = input.sign.key_id;
  delete command.signature;
  command.signature = digest(input.keys[input.sign.key_id], command);
  out.signed = JSON.stringify(command);
}
process.stdout.write(JSON.stringify(out));
