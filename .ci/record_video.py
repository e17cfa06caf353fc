"""
Record a short Procgen video with SB3's ``VecVideoRecorder`` (the video path the documentation shows) and check the
file: ``python .ci/record_video.py [FOLDER]`` exits with an error message when recording fails. CI runs it in a
fresh environment made by the README's first install command alone (``pip install torch==2.13.0 --extra-index-url
... && pip install -e ".[zoo]"``); ``tests/test_quickstart.py`` runs it in the test environment.
"""

import os
import sys
import tempfile

import numpy as np

#: Frames recorded, Procgen's frame size with ``render_mode="rgb_array"`` and its frame rate
VIDEO_LENGTH = 10
FRAME_SIZE = (512, 512)
FPS = 15


def record_video(folder: str) -> str:
    """
    Record ``VIDEO_LENGTH`` frames of StarPilot with random actions into ``folder`` and check the video.

    :param folder: Where the video is written
    :return: The path of the video
    :raises RuntimeError: when no video, or a video of another size, frame rate or length, was written
    """
    from moviepy.video.io.VideoFileClip import VideoFileClip
    from stable_baselines3.common.vec_env import VecVideoRecorder

    from sb3_ppg import make_procgen_env

    env = make_procgen_env("starpilot", n_envs=1, seed=0, render_mode="rgb_array", num_threads=0)
    env = VecVideoRecorder(env, folder, record_video_trigger=lambda step: step == 0, video_length=VIDEO_LENGTH)
    env.reset()
    rng = np.random.default_rng(0)
    for _ in range(VIDEO_LENGTH + 2):
        env.step(rng.integers(env.action_space.n, size=1))
    env.close()
    videos = [name for name in os.listdir(folder) if name.endswith(".mp4")]
    if len(videos) != 1:
        raise RuntimeError(f"expected one .mp4 file in {folder}, found {sorted(os.listdir(folder))}")
    path = os.path.join(folder, videos[0])
    clip = VideoFileClip(path)
    size, fps, n_frames = tuple(clip.size), clip.fps, clip.n_frames
    clip.close()
    if size != FRAME_SIZE or fps != FPS or n_frames < VIDEO_LENGTH:
        raise RuntimeError(
            f"{path}: {size[0]}x{size[1]} at {fps} fps, {n_frames} frames; expected {FRAME_SIZE[0]}x{FRAME_SIZE[1]} "
            f"at {FPS} fps, at least {VIDEO_LENGTH} frames"
        )
    return path


def main() -> None:
    """Record into the folder given as argument, or a temporary one."""
    folder = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="sb3_ppg_video_")
    try:
        path = record_video(folder)
    except Exception as error:
        sys.exit(f"Video recording failed: {type(error).__name__}: {error}")
    print(f"Video recorded: {path}")


if __name__ == "__main__":
    main()
