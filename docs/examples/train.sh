#!/bin/bash
# A script submitted like sbatch: `tessera submit docs/examples/train.sh`. #TESSERA lines are submit flags.
# In `make demo`: as alice (one team, so none is named).
#TESSERA --name resnet-baseline --gpus 1 --cpus 8 --mem 32GiB --time 4h
#TESSERA --priority training
python train.py --model resnet50 --epochs 90
