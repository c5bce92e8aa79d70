"""Where videos come from, without Dagster: a project's inputs (searches, URL lists, files) turned
into candidate videos (`inputs`), their stable ids (`video_ids`), and the yt-dlp client that
searches and lists (`ytdlp_search`); downloading one video is the download stage's
(`assets/download/fetch.py`, its rules and pace beside it). Both are called with the download
stage's `DownloadConfig` (for one download, the projects' sections merged by
`DownloadConfig.merged`) and the YoutubeDL parameters made from it (`ytdlp_params`), under the
host throttle (`throttled_ytdlp`), with yt-dlp's errors sorted (`ytdlp_errors`) into the outcomes
of `errors`. Politeness towards hosts is `politeness`: pauses, request turns and download slots
per host. The `download_client` resource wraps the client for the stages. Probing a downloaded
file lives in `core.media`, which frame extraction shares."""
