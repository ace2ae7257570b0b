"""Imported first by the local pool's fork server (its preload list, `scale.pool.context`): the server
dies with the driver that started it, within milliseconds, also while it is still importing the
stage's heavy modules (torch, open_clip: seconds during which it does not watch its "alive" pipe).
Imports nothing heavy, so that it is armed as early as the server can be."""

from biasaudit.pipeline.lifeline import die_with_driver

die_with_driver()
