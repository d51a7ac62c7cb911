#!/usr/bin/env bash
# golden-family.sh DIR: prints "model_type backend manager" for the golden
# checkpoint in DIR (its config.json): the attention backend and the cache
# manager kvx runs that family with. goldens.sh and gpu-run.sh's
# invariance step both read it, so the two agree on every family.
set -u
mt=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("model_type",""))' "$1/config.json") || exit 1
backend=gqa manager=v2
case $mt in
deepseek_v3) backend=mla ;;
deepseek_v32) backend=dsa ;;
nemotron_h | qwen3_next) manager=mamba ;;
esac
echo "${mt:--} $backend $manager"
