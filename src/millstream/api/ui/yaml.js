// The YAML a datastream spec file uses, parsed in the browser so the console can POST the spec
// as JSON, as `millstream datastream create -f` does after yaml.safe_load. Supported: block
// mappings and sequences by indentation, flow collections ([a, b], {k: v}, over several lines
// too), plain, 'single' and "double" quoted scalars, comments, a leading "---". Scalars
// resolve as PyYAML's do (null/~, true/false/yes/no/on/off, ints, floats with a dot; anything
// else, 24h or 127.0.0.1:9092, is a string). Block scalars (| and >), anchors, tags and several
// documents are refused with the line named: use the CLI for those. JSON is accepted as is.
"use strict";

(function () {
  class YamlError extends Error {
    constructor(line, message) {
      super(line ? `line ${line}: ${message}` : message);
      this.name = "YamlError";
    }
  }

  const NULLS = new Set(["", "~", "null", "Null", "NULL"]);
  const TRUES = new Set(["true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"]);
  const FALSES = new Set(["false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"]);
  const INT = /^[-+]?(?:0|[1-9][0-9_]*)$/;
  const HEX = /^[-+]?0x[0-9a-fA-F_]+$/;
  const FLOAT = /^[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9_]+)(?:[eE][-+][0-9]+)?$/;

  function resolve(text, line) {
    const s = text.trim();
    if (NULLS.has(s)) return null;
    if (TRUES.has(s)) return true;
    if (FALSES.has(s)) return false;
    if (INT.test(s)) return Number(s.replace(/_/g, ""));
    if (HEX.test(s)) {
      const neg = s.startsWith("-");
      const n = parseInt(s.replace(/^[-+]?0x/, "").replace(/_/g, ""), 16);
      return neg ? -n : n;
    }
    if (FLOAT.test(s)) return Number(s.replace(/_/g, ""));
    if (/^[-+]?\.(inf|Inf|INF)$/.test(s)) return s.startsWith("-") ? -Infinity : Infinity;
    if (/^\.(nan|NaN|NAN)$/.test(s)) return NaN;
    if (/^[&*!|>%@`]/.test(s)) {
      throw new YamlError(line, `'${s[0]}' (anchors, tags, block scalars) is not supported here; use the CLI`);
    }
    return s;
  }

  // A quoted scalar starting at s[i]; returns [value, index after the closing quote].
  function quoted(s, i, line) {
    const q = s[i];
    let j = i + 1;
    if (q === "'") {
      let out = "";
      while (j < s.length) {
        if (s[j] === "'") {
          if (s[j + 1] === "'") {
            out += "'";
            j += 2;
            continue;
          }
          return [out, j + 1];
        }
        out += s[j++];
      }
    } else {
      while (j < s.length) {
        if (s[j] === "\\") j += 2;
        else if (s[j] === '"') {
          try {
            return [JSON.parse(s.slice(i, j + 1)), j + 1];
          } catch (e) {
            throw new YamlError(line, `bad escape in ${s.slice(i, j + 1)}`);
          }
        } else j++;
      }
    }
    throw new YamlError(line, `unterminated ${q}quoted${q} string`);
  }

  // Index of the end of the code on a line: before a comment (" #"), outside quotes.
  function codeEnd(s) {
    let i = 0;
    while (i < s.length) {
      const c = s[i];
      if ((c === "'" || c === '"') && (i === 0 || /[\s:,[{\-]/.test(s[i - 1]))) {
        try {
          i = quoted(s, i, 0)[1];
          continue;
        } catch (e) {
          return s.length; // reported when the value is parsed
        }
      }
      if (c === "#" && (i === 0 || /\s/.test(s[i - 1]))) return i;
      i++;
    }
    return s.length;
  }

  // Depth of unclosed flow brackets in s (outside quotes).
  function openBrackets(s) {
    let depth = 0;
    let i = 0;
    while (i < s.length) {
      const c = s[i];
      if ((c === "'" || c === '"') && (i === 0 || /[\s:,[{]/.test(s[i - 1]))) {
        try {
          i = quoted(s, i, 0)[1];
          continue;
        } catch (e) {
          return depth;
        }
      }
      if (c === "[" || c === "{") depth++;
      if (c === "]" || c === "}") depth--;
      i++;
    }
    return depth;
  }

  // Flow collections and scalars: {a: 1, b: [x, y]}.
  function parseFlow(s, line) {
    let i = 0;
    const ws = () => {
      while (i < s.length && /\s/.test(s[i])) i++;
    };
    function plain(stopAtColon) {
      const start = i;
      while (i < s.length) {
        const c = s[i];
        if (c === "," || c === "]" || c === "}") break;
        if (stopAtColon && c === ":" && (i + 1 >= s.length || /[\s,\]}]/.test(s[i + 1]))) break;
        i++;
      }
      return s.slice(start, i);
    }
    function node(isKey) {
      ws();
      const c = s[i];
      if (c === "[") {
        i++;
        const out = [];
        for (;;) {
          ws();
          if (s[i] === "]") {
            i++;
            return out;
          }
          out.push(node(false));
          ws();
          if (s[i] === ",") i++;
          else if (s[i] !== "]") throw new YamlError(line, `expected ',' or ']' in ${s.trim()}`);
        }
      }
      if (c === "{") {
        i++;
        const out = {};
        for (;;) {
          ws();
          if (s[i] === "}") {
            i++;
            return out;
          }
          const key = node(true);
          ws();
          let value = null;
          if (s[i] === ":") {
            i++;
            ws();
            value = s[i] === "," || s[i] === "}" ? null : node(false);
          }
          out[String(key)] = value;
          ws();
          if (s[i] === ",") i++;
          else if (s[i] !== "}") throw new YamlError(line, `expected ',' or '}' in ${s.trim()}`);
        }
      }
      if (c === "'" || c === '"') {
        const [v, j] = quoted(s, i, line);
        i = j;
        return v;
      }
      if (i >= s.length) throw new YamlError(line, `unexpected end of ${s.trim()}`);
      return resolve(plain(isKey), line);
    }
    const value = node(false);
    ws();
    if (i < s.length) throw new YamlError(line, `unexpected '${s.slice(i)}' after a value`);
    return value;
  }

  // "key: value" -> [key, value text] or null when the line is not a mapping entry.
  function splitKey(text, line) {
    let i = 0;
    let key;
    if (text[0] === "'" || text[0] === '"') {
      const [k, j] = quoted(text, 0, line);
      key = k;
      i = j;
      while (text[i] === " ") i++;
      if (text[i] !== ":") return null;
    } else {
      if (/^[[{]/.test(text)) return null;
      const m = /:(\s|$)/.exec(text);
      if (!m) return null;
      i = m.index;
      key = text.slice(0, i).trim();
      const resolved = resolve(key, line);
      key = resolved === null ? "null" : String(resolved);
    }
    return [key, text.slice(i + 1).trim()];
  }

  function isItem(text) {
    return text === "-" || text.startsWith("- ");
  }

  function parse(source) {
    const trimmed = source.trim();
    if (trimmed.startsWith("{")) {
      try {
        return JSON.parse(trimmed);
      } catch (e) {
        // not JSON: a YAML flow mapping
      }
    }
    const lines = [];
    const raw = source.replace(/\r\n?/g, "\n").split("\n");
    let docs = 0;
    for (let n = 0; n < raw.length; n++) {
      if (/\t/.test(raw[n].match(/^\s*/)[0])) throw new YamlError(n + 1, "tabs cannot indent YAML");
      let text = raw[n].slice(0, codeEnd(raw[n])).replace(/\s+$/, "");
      if (/^(---|\.\.\.)(\s|$)/.test(text)) {
        if (text.startsWith("...") || ++docs > 1 || lines.length) {
          throw new YamlError(n + 1, "one YAML document only");
        }
        text = text.slice(3).trim();
      }
      if (!text.trim()) continue;
      const indent = text.length - text.trimStart().length;
      const first = n + 1;
      // A flow collection left open continues on the next lines.
      while (openBrackets(text) > 0 && n + 1 < raw.length) {
        n++;
        text += " " + raw[n].slice(0, codeEnd(raw[n])).trim();
      }
      if (openBrackets(text) > 0) throw new YamlError(first, "unclosed '[' or '{'");
      lines.push({ indent, text: text.trim(), line: first });
    }
    if (!lines.length) throw new YamlError(0, "the spec is empty");
    let pos = 0;

    function block(indent) {
      const ln = lines[pos];
      if (isItem(ln.text)) return sequence(ln.indent);
      if (splitKey(ln.text, ln.line)) return mapping(ln.indent);
      pos++;
      return flowValue(ln.text, ln.line);
    }

    function flowValue(text, line) {
      if (/^[|>]/.test(text)) {
        throw new YamlError(line, "block scalars (| and >) are not supported here; use the CLI");
      }
      return parseFlow(text, line);
    }

    function child(parentIndent, allowSameIndentItems) {
      const next = lines[pos];
      if (!next) return null;
      if (next.indent > parentIndent) return block(next.indent);
      if (allowSameIndentItems && next.indent === parentIndent && isItem(next.text)) {
        return sequence(next.indent);
      }
      return null;
    }

    function mapping(indent) {
      const out = {};
      while (pos < lines.length && lines[pos].indent === indent && !isItem(lines[pos].text)) {
        const ln = lines[pos];
        const kv = splitKey(ln.text, ln.line);
        if (!kv) throw new YamlError(ln.line, `expected 'key: value', got ${ln.text}`);
        pos++;
        const [key, rest] = kv;
        if (Object.prototype.hasOwnProperty.call(out, key)) {
          throw new YamlError(ln.line, `duplicate key '${key}'`);
        }
        out[key] = rest === "" ? child(indent, true) : flowValue(rest, ln.line);
      }
      if (pos < lines.length && lines[pos].indent > indent) {
        throw new YamlError(lines[pos].line, "unexpected indentation");
      }
      return out;
    }

    function sequence(indent) {
      const out = [];
      while (pos < lines.length && lines[pos].indent === indent && isItem(lines[pos].text)) {
        const ln = lines[pos];
        const rest = ln.text.slice(1).trimStart();
        if (rest === "") {
          pos++;
          out.push(child(indent, false));
        } else {
          // "- key: v" opens a mapping whose keys line up with "key".
          const inner = indent + (ln.text.length - rest.length);
          lines[pos] = { indent: inner, text: rest, line: ln.line };
          out.push(block(inner));
        }
      }
      if (pos < lines.length && lines[pos].indent > indent) {
        throw new YamlError(lines[pos].line, "unexpected indentation");
      }
      return out;
    }

    const value = block(lines[0].indent);
    if (pos < lines.length) {
      throw new YamlError(lines[pos].line, `unexpected ${lines[pos].text} (check the indentation)`);
    }
    return value;
  }

  window.MillstreamYaml = { parse, YamlError };
})();
