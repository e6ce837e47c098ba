"""The project's YAML configs as the option defaults read them: whether a file sets a key on, names it, gives it
one value, or leaves it null. Plain text lookups (a key's line, its value up to a comment): the audit reads no
YAML library's view of the files, only whether every file that names a key agrees. DefaultOptions (options.py)
inherits them; `self.p` is the project, `self.cache` the audit's cache."""

from __future__ import annotations

import re
from types import SimpleNamespace

from .files import UNKNOWN, json_scalar, project_files, yaml_scalar
from .syntax import callee, dotted


class YamlConfigs:
    def _cached(self, kind: str, key: str, compute):
        """compute(key), kept per audit: the flag tests ask about the same settings for every branch they read."""
        cache = self.cache.setdefault(kind, {})
        if key not in cache:
            cache[key] = compute(key)
        return cache[key]

    def _yaml_turns_on(self, key: str):
        return self._cached("_yaml_turns_on", key, self._yaml_turns_on_uncached)

    def _yaml_turns_on_uncached(self, key: str) -> bool:
        """Some YAML file of the project sets `key` on (HigherHRNet's `AUTO_RESUME: True` over a False default)."""
        line = re.compile(rf"^\s*{re.escape(key)}\s*:\s*(true|True|yes|1)\b", re.M)
        # ... or a configargparse file (`-cc configs/default_cifar10.txt`, an `is_config_file=True` option:
        # CLD-SGM's `is_image = true`): `key = value` lines
        plain = re.compile(rf"^\s*{re.escape(key)}\s*=\s*(true|True|yes|1)\s*$", re.M)
        ini = any(k.arg == "is_config_file" for mm in self.p.modules.values() for c in mm.calls for k in c.keywords)
        return self.p.on_disk and (any(line.search(path.read_text(encoding="utf-8", errors="replace"))
                                       for suffix in (".yaml", ".yml") for path in project_files(self.p.root, suffix))
                                   or ini and any(plain.search(path.read_text(encoding="utf-8", errors="replace"))
                                                  for suffix in (".txt", ".cfg", ".ini", ".conf")
                                                  for path in project_files(self.p.root, suffix)))

    def yaml_seeds_torch(self) -> bool:
        """A YAML config of the project seeds torch when it is loaded (SpeechBrain's hyperpyyaml: `__set_seed:
        !apply:speechbrain.utils.seed_everything [!ref <seed>]`, or `!apply:torch.manual_seed`)."""
        line = re.compile(r"!apply:[\w.]*(manual_seed|seed_everything|set_seed)\b")
        loads = any("hyperpyyaml" in (imp[0] or "") or name == "load_hyperpyyaml"
                    for mm in self.p.modules.values() for name, imp in mm.imports.items())  # (only hyperpyyaml
        # runs `!apply:` when it loads the file)
        return self.p.on_disk and loads and any(line.search(path.read_text(encoding="utf-8", errors="replace"))
                                      for suffix in (".yaml", ".yml") for path in project_files(self.p.root, suffix))

    def _yaml_names(self, key: str) -> bool:
        """Some YAML file of the project sets `key` (to anything)."""
        if not self.p.on_disk:
            return False
        line = re.compile(rf"^\s*{re.escape(key)}\s*:", re.M)
        return any(line.search(path.read_text(encoding="utf-8", errors="replace"))
                   for suffix in (".yaml", ".yml") for path in project_files(self.p.root, suffix))

    def yaml_files_naming(self, key: str, section: bool = False) -> bool | None:
        """True when every YAML file of the project sets `key` (opens a `key:` section, with `section`), False
        when none does, else None (or no YAML)."""
        line = re.compile(rf"^\s*{re.escape(key)}\s*:" + (r"[ \t]*(#.*)?$" if section else ""), re.M)
        named = {bool(line.search(path.read_text(encoding="utf-8", errors="replace")))
                 for suffix in (".yaml", ".yml") for path in project_files(self.p.root, suffix)}
        return named.pop() if len(named) == 1 else None

    def yaml_places(self, key: str) -> list:
        """(file, line) places where a YAML file of the project sets `key`, as related places of a finding: shaped
        like (module, node) for Hit.related (`.path`, `.lineno`); US3L's `SYNC_BN: False` in its cifar config."""
        if not self.p.on_disk:
            return []
        line = re.compile(rf"^\s*{re.escape(key)}\s*:")
        return [(SimpleNamespace(path=path), SimpleNamespace(lineno=i))
                for suffix in (".yaml", ".yml") for path in project_files(self.p.root, suffix)
                for i, text in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
                if line.match(text)]

    def _yaml_value(self, key: str):
        return self._cached("_yaml_value", key, self._yaml_value_uncached)

    def _yaml_value_uncached(self, key: str):
        """The one number, boolean or null every YAML file of the project that names `key` gives it, else UNKNOWN
        (CNMT's `seed: null` in base.yml: its trainer's `if seed is None: return` skips the seeding)."""
        if not self.p.on_disk:
            return UNKNOWN
        line = re.compile(rf"^\s*{re.escape(key)}\s*:\s*([^\s#]+)", re.M)
        raw = {v.strip("'\"") for suffix in (".yaml", ".yml") for path in project_files(self.p.root, suffix)
               for v in line.findall(path.read_text(encoding="utf-8", errors="replace"))}
        if len(raw) != 1:
            return UNKNOWN
        text = raw.pop()
        if text.lower() in ("null", "~", "none"):
            return None
        return {"true": True, "false": False}.get(text.lower(), int(text) if text.lstrip("-").isdigit() else UNKNOWN)

    def _yaml_null(self, key: str) -> bool:
        """Every YAML file of the project that names `key` leaves it null (and one does)."""
        if not self.p.on_disk:
            return False
        line = re.compile(rf"^([ \t]*){re.escape(key)}[ \t]*:[ \t]*([^\s#]*)[^\n]*\n?"
                          r"((?:[ \t]*(?:#[^\n]*)?\n)*)([ \t]*)", re.M)  # (indent, value, blank lines, next indent)
        raw = set()
        for path in (p for suffix in (".yaml", ".yml") for p in project_files(self.p.root, suffix)):
            for indent, value, _, below in line.findall(path.read_text(encoding="utf-8", errors="replace")):
                # an empty value is null, unless the lines below it are indented deeper: then it opens a section
                raw.add(value.strip("'\"") if value or len(below) > len(indent) else "null")
        return bool(raw) and raw <= {"null", "~", "None", "none"}

    def _yaml_default(self, key: str, default):
        """`default` when no YAML file of the project sets `key` to anything else (`gradient_accumulation_steps: 1`
        in every config, or the key absent); the one other value they all give it; else UNKNOWN."""
        if default is UNKNOWN or not self.p.on_disk:
            return UNKNOWN
        line = re.compile(rf"^\s*{re.escape(key)}\s*:[ \t]*([^\s#]+)", re.M)
        given = {value.strip("'\"") for suffix in (".yaml", ".yml") for path in project_files(self.p.root, suffix)
                 for value in line.findall(path.read_text(encoding="utf-8", errors="replace"))} - {str(default)}
        if given:  # the one value every YAML that sets the key gives (VQ-Diffusion's `adjust_lr: none`), typed
            return yaml_scalar(given.pop()) if len(given) == 1 else UNKNOWN
        # ... and the JSON configs (gtn_applications' `config.get("seed", None)` with `"seed": 0` in tds2d.json)
        pair = re.compile(rf'"{re.escape(key)}"\s*:\s*([^,\s}}\]]+)')
        for path in project_files(self.p.root, ".json"):
            text = path.read_text(encoding="utf-8", errors="replace") if path.stat().st_size < 1_000_000 else ""
            if any(json_scalar(value) != default for value in pair.findall(text)):
                return UNKNOWN
        return default

    def json_option_value(self, key: str):
        """The one scalar every JSON config of the project that names `key` gives it, when a script copies a
        JSON file's keys onto its options (VLN-HAMT's `for k, v in json.load(open(args.config)).items():
        setattr(args, k, v)`, `"gradient_accumulation_steps": 1` over the parser's 16); else UNKNOWN."""
        return self._cached("json_option_value", key, self._json_option_value_uncached)

    def _json_option_value_uncached(self, key: str):
        mods = self.p.modules.values()
        if not self.p.on_disk or not any(dotted(c.func) == "json.load" for mm in mods for c in mm.calls) or not any(
                callee(c) == "setattr" for mm in mods for c in mm.calls):
            return UNKNOWN
        pair = re.compile(rf'"{re.escape(key)}"\s*:\s*([^,\s}}\]]+)')
        values = {json_scalar(v) for path in project_files(self.p.root, ".json") if path.stat().st_size < 1_000_000
                  for v in pair.findall(path.read_text(encoding="utf-8", errors="replace"))}
        return values.pop() if len(values) == 1 else UNKNOWN
