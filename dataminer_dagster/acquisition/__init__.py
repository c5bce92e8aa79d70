"""The yt-dlp client, without Dagster and without any stage's config: the YoutubeDL parameters
made from a download's settings (`ytdlp_params`, `YtDlpOptions`: what it reads of them), the
searches and listings (`ytdlp_search`), the host throttle around every call (`throttled_ytdlp`),
yt-dlp's errors sorted (`ytdlp_errors`) into the outcomes of `errors`, the egress policy on every
address it connects to (`egress`), politeness towards hosts (`politeness`: pauses, request turns
and download slots per host) and videos' stable ids and what was found of them (`video_ids`). A
project's inputs are turned into candidate videos by the catalog stage
(`assets/catalog/inputs.py`); downloading one video is the download stage's
(`assets/download/fetch.py`, its rules and pace beside it); both call this client with the
download stage's `DownloadConfig`. The `download_client` resource wraps the client for the
stages. Probing a downloaded file lives in `core.media`, which frame extraction shares."""
