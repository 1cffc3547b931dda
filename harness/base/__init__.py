"""Plain helpers every layer may use: errors, files, the platform, prompt sets, vocabularies, target
backends, devices and llama.cpp as a reference instrument. Imports nothing of the suite above.
"""
