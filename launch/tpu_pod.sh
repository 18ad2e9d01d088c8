#!/usr/bin/env bash
# Thin wrapper: `bash launch/tpu_pod.sh <create|setup|run|logs|ssh|delete|all> [flags]`.
# tpu_pod.py is stdlib-only, so any python3 >= 3.9 works; it does not need the project's venv.
exec "${PYTHON:-python3}" "$(dirname "$0")/tpu_pod.py" "$@"
