"""Protobuf code generated from proto/*.proto by scripts/gen_proto.py: do not edit, regenerate.

Only :mod:`mesh.codec` imports it; everything else sees the frozen values of :mod:`mesh.messages`.
"""
