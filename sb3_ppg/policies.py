"""
The policies' old module path, kept for model zips saved before they moved to :mod:`sb3_ppg.ppg.policies` (a zip
names its policy class by module path). Import from :mod:`sb3_ppg` or :mod:`sb3_ppg.ppg.policies` instead.
"""

from sb3_ppg.ppg.policies import PPGCnnPolicy, PPGMultiInputPolicy, PPGPolicy, ProcgenCnnPolicy

__all__ = ["PPGCnnPolicy", "PPGMultiInputPolicy", "PPGPolicy", "ProcgenCnnPolicy"]
